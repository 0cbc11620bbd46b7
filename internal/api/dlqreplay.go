package api

import (
	"net/http"

	"github.com/llmq/llmq/internal/job"
)

// ReplayFilteredResponse is the body of POST /v1/dlq/replay.
type ReplayFilteredResponse struct {
	// Matched is how many dead letters the filters selected before the
	// replay (with dry_run, all the call does is count them).
	Matched int64 `json:"matched"`
	DryRun  bool  `json:"dry_run"`
	// Replayed lists the dead letters replayed, each as POST
	// /v1/dlq/{id}/replay would have answered it.
	Replayed []ReplayResponse `json:"replayed"`
	// Failed lists those that could not be replayed and why; they stay in
	// the dead-letter queue.
	Failed []ReplayFailure `json:"failed"`
	// Remaining is how many dead letters the filters still select
	// afterwards: the failed ones and any beyond limit.
	Remaining int64 `json:"remaining"`
}

// ReplayFailure is a dead letter a filtered replay left where it was.
type ReplayFailure struct {
	ID    int64     `json:"id"`
	JobID string    `json:"job_id,omitempty"`
	Error ErrorBody `json:"error"`
}

// handleDLQReplayFiltered replays the dead letters GET /v1/dlq's filters
// select, oldest first, at most limit of them, each exactly as POST
// /v1/dlq/{id}/replay does; dry_run=true only counts them, for a
// confirmation ("replay 132 dead letters?"). A dead letter that fails is
// reported and kept, and the run goes on with the next.
func (s *Server) handleDLQReplayFiltered(w http.ResponseWriter, r *http.Request, tenant string) {
	f, e := deadLetterFilter(r, tenant)
	var limit int
	var dryRun bool
	if e == nil {
		limit, e = parseLimit(r)
	}
	if e == nil {
		dryRun, e = parseBool(r, "dry_run")
	}
	if e == nil && f.Cursor != "" {
		e = badQuery("cursor", "a replay takes filters, not a cursor")
	}
	if e != nil {
		writeError(w, e)
		return
	}
	ctx := r.Context()
	matched, err := s.store.CountDeadLetters(ctx, f)
	if err != nil {
		writeError(w, s.storeError("count dead letters", job.Key{Tenant: tenant}, err))
		return
	}
	resp := ReplayFilteredResponse{Matched: matched, DryRun: dryRun, Replayed: []ReplayResponse{}, Failed: []ReplayFailure{}, Remaining: matched}
	if dryRun || matched == 0 {
		writeJSON(w, http.StatusOK, resp)
		return
	}
	for done := 0; done < limit; {
		f.Limit = min(limit-done, 100)
		page, next, err := s.store.FindDeadLetters(ctx, f)
		if err != nil {
			writeError(w, s.storeError("list dead letters", job.Key{Tenant: tenant}, err))
			return
		}
		for _, dl := range page {
			out, e := s.replay(ctx, dl)
			if e != nil {
				resp.Failed = append(resp.Failed, ReplayFailure{ID: dl.ID, JobID: dl.JobID, Error: e.Body})
			} else {
				resp.Replayed = append(resp.Replayed, out)
			}
		}
		done += len(page)
		if next == "" {
			break
		}
		f.Cursor = next
	}
	f.Cursor = ""
	if resp.Remaining, err = s.store.CountDeadLetters(ctx, f); err != nil {
		writeError(w, s.storeError("count dead letters", job.Key{Tenant: tenant}, err))
		return
	}
	writeJSON(w, http.StatusAccepted, resp)
}
