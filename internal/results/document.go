// Package results turns finished jobs into what goes back to the backends
// that submitted them: the job document (GET /v1/jobs/{id} and every
// event's data), the versioned result event, and the relay that publishes
// events from the outbox Postgres fills (docs/design.md#results).
package results

import (
	"encoding/json"
	"time"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// Document is a job as the API shows it and as every result event carries
// it (api/schemas/status.schema.json).
type Document struct {
	ID       string       `json:"id"`
	Tenant   string       `json:"tenant"`
	Status   job.Status   `json:"status"`
	Model    string       `json:"model"`
	Kind     job.Kind     `json:"kind"`
	Priority job.Priority `json:"priority"`
	// ModelUsed is the model that answered (a fallback after 429s).
	ModelUsed *string         `json:"model_used"`
	Attempts  int             `json:"attempts"`
	Response  json.RawMessage `json:"response"`
	// ResponseOmitted is set only in a result event its broker refused
	// whole for its size (Kafka's message.max.bytes): Response is then
	// null, and GET /v1/jobs/{id} has it (SlimEvent).
	ResponseOmitted bool   `json:"response_omitted,omitempty"`
	Usage           *Usage `json:"usage"`
	Error           *Error `json:"error"`
	// Metadata is the job's metadata, returned as the producer sent it.
	Metadata      json.RawMessage `json:"metadata,omitempty"`
	CorrelationID string          `json:"correlation_id,omitempty"`
	CreatedAt     time.Time       `json:"created_at"`
	StartedAt     *time.Time      `json:"started_at,omitempty"`
	CompletedAt   *time.Time      `json:"completed_at"`
	// BatchID is the provider batch a batched job waits in (llmq's batch
	// number; docs/design.md#batch-offload); absent in other statuses.
	BatchID *int64 `json:"batch_id,omitempty"`
	// ExpectedStartAt is, for a queued job, when it should start: the
	// backlog ahead of it in its lane over the lane's measured drain rate.
	ExpectedStartAt *time.Time `json:"expected_start_at,omitempty"`
	// Webhook is the state of the job's latest webhook delivery, if any.
	Webhook *WebhookState `json:"webhook,omitempty"`
	// AttemptLog is every attempt of the job, oldest first (GET
	// /v1/jobs/{id} only, where it is always present; result events leave
	// it out).
	AttemptLog *[]Attempt `json:"attempt_log,omitempty"`
}

// Usage is the token usage of the successful call.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Error is the last failed attempt of a job that has not succeeded.
type Error struct {
	Attempt int       `json:"attempt"`
	Model   string    `json:"model,omitempty"`
	Kind    string    `json:"kind"`
	Code    string    `json:"code,omitempty"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
}

// WebhookState is where a job's webhook delivery stands.
type WebhookState struct {
	Status    string     `json:"status"` // pending, delivered, dead
	Attempts  int        `json:"attempts"`
	LastError string     `json:"last_error,omitempty"`
	NextAt    *time.Time `json:"next_attempt_at,omitempty"`
}

// DocumentOf is the document of a stored job.
func DocumentOf(rec store.Record) Document {
	d := Document{
		ID:            rec.ID,
		Tenant:        rec.Tenant,
		Status:        rec.Status,
		Model:         rec.Model,
		Kind:          job.KindOf(rec.Kind),
		Priority:      rec.Priority,
		Attempts:      rec.Attempts,
		Response:      rec.Response,
		Metadata:      rec.Metadata,
		CorrelationID: rec.CorrelationID,
		CreatedAt:     rec.CreatedAt,
		StartedAt:     rec.StartedAt,
		CompletedAt:   rec.CompletedAt,
	}
	if string(d.Metadata) == "null" {
		d.Metadata = nil
	}
	if rec.Status == job.StatusBatched {
		d.BatchID = rec.BatchID
	}
	if rec.ModelUsed != "" {
		m := rec.ModelUsed
		d.ModelUsed = &m
	}
	if rec.Status == job.StatusSucceeded {
		d.Usage = &Usage{PromptTokens: rec.PromptTokens, CompletionTokens: rec.CompletionTokens, TotalTokens: rec.PromptTokens + rec.CompletionTokens}
	} else if n := len(rec.Errors); n > 0 {
		e := rec.Errors[n-1]
		d.Error = &Error{Attempt: e.Attempt, Model: e.Model, Kind: e.Kind, Code: e.Code, Message: e.Message, At: e.At}
	}
	return d
}

// WebhookStateOf is the document's view of a job's latest delivery.
func WebhookStateOf(st store.WebhookState) *WebhookState {
	return &WebhookState{Status: st.Status, Attempts: st.Attempts, LastError: st.LastError, NextAt: st.NextAttemptAt}
}

// Attempt is one attempt of a job's timeline, as GET /v1/jobs/{id} shows
// it: the stored entry (store.AttemptLogEntry) and the waits read from it.
type Attempt struct {
	store.AttemptLogEntry
	// WaitMS is the time before the attempt: from the end of the previous
	// attempt (for the first, from the job's creation) to the start of
	// its call, or to its claim or end when no call went out. It holds
	// the backoff, the time in the queue and the admission wait.
	WaitMS int64 `json:"wait_ms"`
	// AdmissionWaitMS is the part of the wait this replica spent between
	// claiming the job and its call going out: the fair queue and the
	// quota's admission. Absent when the attempt made no call.
	AdmissionWaitMS *int64 `json:"admission_wait_ms,omitempty"`
	// DurationMS is the provider call's duration; absent without a call.
	DurationMS *int64 `json:"duration_ms,omitempty"`
}

// AttemptsOf is the timeline of a job created at created from its
// attempt log, oldest first.
func AttemptsOf(created time.Time, log []store.AttemptLogEntry) []Attempt {
	out := make([]Attempt, len(log))
	prev := created
	ms := func(from, to time.Time) int64 { return max(to.Sub(from).Milliseconds(), 0) }
	for i, e := range log {
		a := Attempt{AttemptLogEntry: e}
		begin := e.EndedAt
		switch {
		case e.StartedAt != nil:
			begin = *e.StartedAt
		case e.ClaimedAt != nil:
			begin = *e.ClaimedAt
		}
		a.WaitMS = ms(prev, begin)
		if e.StartedAt != nil {
			d := ms(*e.StartedAt, e.EndedAt)
			a.DurationMS = &d
			if e.ClaimedAt != nil {
				w := ms(*e.ClaimedAt, *e.StartedAt)
				a.AdmissionWaitMS = &w
			}
		}
		out[i] = a
		prev = e.EndedAt
	}
	return out
}
