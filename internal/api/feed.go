package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// FeedResponse is the body of GET /v1/jobs?finished_after=: the next jobs
// to finish, and the cursor to ask with next time, always present (the
// same one when nothing new finished).
type FeedResponse struct {
	Jobs       []JobView `json:"jobs"`
	NextCursor string    `json:"next_cursor"`
}

// splitList splits a comma-separated query value, dropping empty items.
func splitList(raw string) []string {
	var out []string
	for item := range strings.SplitSeq(raw, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// handleGetMany answers GET /v1/jobs?ids=a,b,c: the tenant's jobs among
// the ids, in their order, in one query; unknown ids are absent.
func (s *Server) handleGetMany(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	for _, other := range []string{"status", "cursor", "finished_after", "limit"} {
		if q.Has(other) {
			writeError(w, badQuery("ids", "ids cannot be combined with "+other))
			return
		}
	}
	asked := splitList(q.Get("ids"))
	if len(asked) > store.MaxGetMany {
		writeError(w, badQuery("ids", fmt.Sprintf("ids names at most %d jobs", store.MaxGetMany)))
		return
	}
	ids := make([]string, 0, len(asked))
	for _, id := range asked {
		if job.ValidID(id) { // an id no job can have is simply not found
			ids = append(ids, id)
		}
	}
	recs, err := s.store.GetMany(r.Context(), tenant, ids)
	if err != nil {
		writeError(w, s.storeError("get jobs", job.Key{Tenant: tenant}, err))
		return
	}
	resp := ListResponse{Jobs: s.viewsOf(r.Context(), recs)}
	writeJSON(w, http.StatusOK, resp)
}

// handleFeed answers GET /v1/jobs?finished_after=<cursor>[&status=…]: the
// tenant's jobs in the order they finished, each once per finish, from the
// cursor ("" for the beginning).
func (s *Server) handleFeed(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	if q.Has("cursor") {
		writeError(w, badQuery("cursor", "the feed pages with finished_after, not cursor"))
		return
	}
	f := store.FeedFilter{Tenant: tenant, After: q.Get("finished_after")}
	for _, raw := range splitList(q.Get("status")) {
		st := job.Status(raw)
		if !st.Terminal() {
			writeError(w, badQuery("status", "the feed lists finished jobs: status must be among succeeded, failed, dead, cancelled"))
			return
		}
		f.Statuses = append(f.Statuses, st)
	}
	limit, e := parseLimit(r)
	if e != nil {
		writeError(w, e)
		return
	}
	f.Limit = limit
	recs, next, err := s.store.Feed(r.Context(), f)
	if err != nil {
		if errors.Is(err, store.ErrBadCursor) {
			writeError(w, badQuery("finished_after", "finished_after is not a cursor this API returned"))
			return
		}
		writeError(w, s.storeError("job feed", job.Key{Tenant: tenant}, err))
		return
	}
	resp := FeedResponse{Jobs: s.viewsOf(r.Context(), recs), NextCursor: next}
	writeJSON(w, http.StatusOK, resp)
}
