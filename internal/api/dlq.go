package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// DeadLetterView is one entry of GET /v1/dlq.
type DeadLetterView struct {
	ID            int64           `json:"id"`
	JobID         string          `json:"job_id,omitempty"`
	Lane          string          `json:"lane"`
	Reason        string          `json:"reason"`
	Attempts      int             `json:"attempts"`
	LastError     string          `json:"last_error,omitempty"`
	FirstFailedAt time.Time       `json:"first_failed_at"`
	LastFailedAt  time.Time       `json:"last_failed_at"`
	CreatedAt     time.Time       `json:"created_at"`
	Body          json.RawMessage `json:"body,omitempty"`        // the original message when it is JSON
	BodyBase64    []byte          `json:"body_base64,omitempty"` // else its bytes
}

// DLQResponse is the body of GET /v1/dlq.
type DLQResponse struct {
	DeadLetters []DeadLetterView `json:"dead_letters"`
	NextCursor  string           `json:"next_cursor,omitempty"`
}

// ReplayResponse is the body of POST /v1/dlq/{id}/replay.
type ReplayResponse struct {
	ID     int64      `json:"id"`
	JobID  string     `json:"job_id,omitempty"`
	Status job.Status `json:"status"`
}

func deadLetterView(dl store.DeadLetterRow) DeadLetterView {
	v := DeadLetterView{
		ID: dl.ID, JobID: dl.JobID, Lane: string(dl.Lane), Reason: dl.Reason, Attempts: dl.Attempts,
		LastError: dl.LastError, FirstFailedAt: dl.FirstFailedAt, LastFailedAt: dl.LastFailedAt, CreatedAt: dl.CreatedAt,
	}
	if json.Valid(dl.Body) {
		v.Body = json.RawMessage(dl.Body)
	} else {
		v.BodyBase64 = dl.Body
	}
	return v
}

func (s *Server) handleDLQList(w http.ResponseWriter, r *http.Request, tenant string) {
	limit, e := parseLimit(r)
	if e != nil {
		writeError(w, e)
		return
	}
	rows, next, err := s.store.ListDeadLetters(r.Context(), tenant, r.URL.Query().Get("cursor"), limit)
	if err != nil {
		if errors.Is(err, store.ErrBadCursor) {
			writeError(w, &errorResponse{Status: http.StatusBadRequest, Body: ErrorBody{Code: CodeInvalidRequest, Field: "cursor", Message: "cursor is not one this API returned"}})
			return
		}
		writeError(w, s.storeError("list dead letters", job.Key{Tenant: tenant}, err))
		return
	}
	resp := DLQResponse{DeadLetters: make([]DeadLetterView, 0, len(rows)), NextCursor: next}
	for _, row := range rows {
		resp.DeadLetters = append(resp.DeadLetters, deadLetterView(row))
	}
	writeJSON(w, http.StatusOK, resp)
}

var errDeadLetterNotFound = apiError(http.StatusNotFound, CodeNotFound, "no such dead letter")

// handleDLQReplay re-publishes a dead letter's original body to its lane and
// moves its job back to queued. Order: the job row goes to queued first (so
// the consumer can claim the message it is about to get), then the message
// is published with confirm, then the dead letter is removed. If the publish
// fails the job is put back to dead (a replayed failed job too) and the dead letter stays, so a replay
// can be tried again.
func (s *Server) handleDLQReplay(w http.ResponseWriter, r *http.Request, tenant string) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, errDeadLetterNotFound)
		return
	}
	ctx := r.Context()
	dl, err := s.store.GetDeadLetter(ctx, tenant, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			writeError(w, errDeadLetterNotFound)
			return
		}
		writeError(w, s.storeError("get dead letter", job.Key{Tenant: tenant}, err))
		return
	}
	lane := job.Priority(dl.Lane)
	if !lane.Valid() {
		lane = job.PriorityNormal
	}
	key := job.Key{Tenant: tenant, ID: dl.JobID}
	status := job.StatusQueued
	replayed := false
	if dl.JobID != "" {
		rec, err := s.store.Replay(ctx, key)
		switch {
		case err == nil:
			replayed = true
			status = rec.Status
		case errors.Is(err, store.ErrNotFound):
			// A message whose job never got a row (e.g. malformed): publish only.
		default:
			writeError(w, s.storeError("replay job", key, err))
			return
		}
	}
	pctx, cancel := context.WithTimeout(ctx, s.publishTimeout)
	pubErr := s.pub.Publish(pctx, lane, broker.Message{Key: dl.JobID, Body: dl.Body, Headers: map[string]string{"tenant": tenant}})
	cancel()
	if pubErr != nil {
		s.log.Warn("replay dead letter: publish", "tenant", tenant, "dead_letter_id", id, "job_id", dl.JobID, "error", pubErr)
		if replayed {
			// Back to dead (queued → dead is allowed), so the job is not left
			// queued without a message; the dead letter stays for a retry.
			e := store.AttemptError{Kind: "replay", Message: "replay publish failed: " + pubErr.Error()}
			if _, err := s.store.MarkDead(context.WithoutCancel(ctx), key, "", 0, e); err != nil {
				s.log.Error("replay dead letter: restore dead status", "tenant", tenant, "job_id", dl.JobID, "error", err)
			}
		}
		e := apiError(http.StatusServiceUnavailable, CodeBrokerUnavailable, "the broker did not confirm the replayed message; the dead letter is kept, retry later")
		e.RetryAfter = 5
		writeError(w, e)
		return
	}
	if _, err := s.store.TakeDeadLetter(context.WithoutCancel(ctx), tenant, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Error("replay dead letter: remove", "tenant", tenant, "dead_letter_id", id, "error", err)
	}
	writeJSON(w, http.StatusAccepted, ReplayResponse{ID: id, JobID: dl.JobID, Status: status})
}
