package api

import (
	"encoding/json"
	"net/http"

	"github.com/llmq/llmq/internal/job"
)

// JobRequestView is the body of GET /v1/jobs/{id}/request: what the job
// asked, as submitted. The job document leaves it out (so do its result
// events, which would carry every prompt twice); the console's job detail
// reads it here.
type JobRequestView struct {
	ID             string          `json:"id"`
	Tenant         string          `json:"tenant"`
	Model          string          `json:"model"`
	Kind           job.Kind        `json:"kind"`
	FallbackModels []string        `json:"fallback_models,omitempty"`
	Priority       job.Priority    `json:"priority"`
	MaxAttempts    int             `json:"max_attempts,omitempty"`
	Request        json.RawMessage `json:"request"`
}

func (s *Server) handleGetRequest(w http.ResponseWriter, r *http.Request, tenant string) {
	key := job.Key{Tenant: tenant, ID: r.PathValue("id")}
	if !job.ValidID(key.ID) {
		writeError(w, errNotFound)
		return
	}
	rec, err := s.store.Get(r.Context(), key)
	if err != nil {
		writeError(w, s.storeError("get job request", key, err))
		return
	}
	writeJSON(w, http.StatusOK, JobRequestView{ID: rec.ID, Tenant: rec.Tenant, Model: rec.Model, Kind: job.KindOf(rec.Kind),
		FallbackModels: rec.FallbackModels, Priority: rec.Priority, MaxAttempts: rec.MaxAttempts, Request: rec.Request})
}
