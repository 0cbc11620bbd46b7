package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
)

// JobView is the body of GET /v1/jobs/{id} and of each listed job: the
// job document every result event carries too.
type JobView = results.Document

func viewOf(rec store.Record) JobView { return results.DocumentOf(rec) }

var errNotFound = apiError(http.StatusNotFound, CodeNotFound, "no such job")

// storeError maps a store error of a job operation to its response.
func (s *Server) storeError(op string, key job.Key, err error) *errorResponse {
	var te *job.TransitionError
	switch {
	case errors.Is(err, store.ErrNotFound):
		return errNotFound
	case errors.As(err, &te):
		return apiError(http.StatusConflict, CodeConflict, fmt.Sprintf("the job is %s and cannot move to %s", te.From, te.To))
	}
	s.log.Error(op, "tenant", key.Tenant, "job_id", key.ID, "error", err)
	e := apiError(http.StatusServiceUnavailable, CodeStoreUnavailable, "the job store is unavailable; retry later")
	e.RetryAfter = 5
	return e
}

// webhookStater is the part of *store.Store that reads delivery state; a
// store without it shows no webhook member.
type webhookStater interface {
	WebhookStates(ctx context.Context, keys []job.Key) (map[job.Key]store.WebhookState, error)
}

// viewsOf is the documents of recs, with their webhook deliveries read in
// one query.
func (s *Server) viewsOf(ctx context.Context, recs []store.Record) []JobView {
	out := make([]JobView, len(recs))
	ptrs := make([]*JobView, len(recs))
	for i, rec := range recs {
		out[i] = viewOf(rec)
		ptrs[i] = &out[i]
	}
	s.addWebhookStates(ctx, ptrs)
	return out
}

// addWebhookStates fills each document's webhook member from its job's
// latest delivery. The jobs are still worth showing without it: a failed
// read is logged, not answered.
func (s *Server) addWebhookStates(ctx context.Context, views []*JobView) {
	ws, ok := s.store.(webhookStater)
	if !ok || len(views) == 0 {
		return
	}
	keys := make([]job.Key, len(views))
	for i, v := range views {
		keys[i] = job.Key{Tenant: v.Tenant, ID: v.ID}
	}
	states, err := ws.WebhookStates(ctx, keys)
	if err != nil {
		s.log.Warn("read webhook states", "jobs", len(keys), "error", err)
		return
	}
	for i, v := range views {
		if st, ok := states[keys[i]]; ok {
			v.Webhook = results.WebhookStateOf(st)
		}
	}
}

func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request, tenant string) {
	key := job.Key{Tenant: tenant, ID: r.PathValue("id")}
	if !job.ValidID(key.ID) {
		writeError(w, errNotFound)
		return
	}
	rec, err := s.store.Cancel(r.Context(), key)
	if err != nil {
		writeError(w, s.storeError("cancel job", key, err))
		return
	}
	writeJSON(w, http.StatusOK, viewOf(rec))
}

// ListResponse is the body of GET /v1/jobs.
type ListResponse struct {
	Jobs []JobView `json:"jobs"`
	// NextCursor, when not empty, fetches the next page.
	NextCursor string `json:"next_cursor,omitempty"`
}

const (
	defaultListLimit = 50
	maxListLimit     = 500
)

// parseLimit reads ?limit=, defaulting and capping it.
func parseLimit(r *http.Request) (int, *errorResponse) {
	raw := r.URL.Query().Get("limit")
	if raw == "" {
		return defaultListLimit, nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 || n > maxListLimit {
		return 0, badQuery("limit", fmt.Sprintf("limit must be an integer between 1 and %d", maxListLimit))
	}
	return n, nil
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	if (q.Has("ids") || q.Has("finished_after")) && tenant == allTenants {
		writeError(w, badQuery(tenantParam, "tenant=* lists jobs; ids and finished_after read one tenant's"))
		return
	}
	switch {
	case q.Has("ids"):
		s.handleGetMany(w, r, tenant)
		return
	case q.Has("finished_after"):
		s.handleFeed(w, r, tenant)
		return
	}
	f, e := jobListFilter(r, tenant)
	if e != nil {
		writeError(w, e)
		return
	}
	recs, next, err := s.store.List(r.Context(), f)
	if err != nil {
		if errors.Is(err, store.ErrBadCursor) {
			writeError(w, badQuery("cursor", "cursor is not one this API returned"))
			return
		}
		writeError(w, s.storeError("list jobs", job.Key{Tenant: tenant}, err))
		return
	}
	resp := ListResponse{Jobs: s.viewsOf(r.Context(), recs), NextCursor: next}
	writeJSON(w, http.StatusOK, resp)
}
