package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// ResultEvent is one row of the result outbox: a job's terminal
// transition, written by the jobs table's trigger in the transaction that
// made it (migrations/00004_results.sql).
type ResultEvent struct {
	Seq        int64
	EventID    string
	OccurredAt time.Time
	// Job is the row as it finished, without its request.
	Job Record
}

// WebhookDelivery is one webhook to send for a result event.
type WebhookDelivery struct {
	EventID, Tenant, JobID, URL string
	// Payload is the exact body signed and sent on every attempt.
	Payload []byte
}

// snapshot is the JSON of a jobs row (to_jsonb), as the outbox keeps it.
type snapshot struct {
	Tenant           string          `json:"tenant"`
	ID               string          `json:"id"`
	Model            string          `json:"model"`
	FallbackModels   []string        `json:"fallback_models"`
	Priority         string          `json:"priority"`
	Metadata         json.RawMessage `json:"metadata"`
	Status           string          `json:"status"`
	Attempts         int             `json:"attempts"`
	MaxAttempts      int             `json:"max_attempts"`
	ModelUsed        *string         `json:"model_used"`
	Response         json.RawMessage `json:"response"`
	PromptTokens     *int            `json:"prompt_tokens"`
	CompletionTokens *int            `json:"completion_tokens"`
	Errors           []AttemptError  `json:"errors"`
	Deadline         *time.Time      `json:"deadline"`
	CreatedAt        time.Time       `json:"created_at"`
	StartedAt        *time.Time      `json:"started_at"`
	CompletedAt      *time.Time      `json:"completed_at"`
	UpdatedAt        time.Time       `json:"updated_at"`
	ReplyTo          *string         `json:"reply_to"`
	CorrelationID    *string         `json:"correlation_id"`
	CallbackURL      *string         `json:"callback_url"`
	ResultTopic      *string         `json:"result_topic"`
}

func (s snapshot) record() Record {
	r := Record{
		Job: job.Job{ID: s.ID, Tenant: s.Tenant, Model: s.Model, FallbackModels: s.FallbackModels,
			Priority: job.Priority(s.Priority), MaxAttempts: s.MaxAttempts, Deadline: s.Deadline,
			ReplyTo: deref(s.ReplyTo), CorrelationID: deref(s.CorrelationID),
			CallbackURL: deref(s.CallbackURL), ResultTopic: deref(s.ResultTopic)},
		Status: job.Status(s.Status), Attempts: s.Attempts, ModelUsed: deref(s.ModelUsed),
		Errors: s.Errors, CreatedAt: s.CreatedAt.UTC(), StartedAt: utcPtr(s.StartedAt),
		CompletedAt: utcPtr(s.CompletedAt), UpdatedAt: s.UpdatedAt.UTC(),
	}
	if len(s.FallbackModels) == 0 {
		r.FallbackModels = nil
	}
	if len(s.Metadata) > 0 && string(s.Metadata) != "null" {
		r.Metadata = s.Metadata
	}
	if len(s.Response) > 0 && string(s.Response) != "null" {
		r.Response = s.Response
	}
	if s.PromptTokens != nil {
		r.PromptTokens = *s.PromptTokens
	}
	if s.CompletionTokens != nil {
		r.CompletionTokens = *s.CompletionTokens
	}
	return r
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// RelayResults takes up to max outbox events, oldest first, that no other
// relay holds (FOR UPDATE SKIP LOCKED: replicas share the outbox without
// waiting on each other), and hands them to publish. When publish returns
// nil, the webhook deliveries it returns are stored and the events deleted,
// in the same transaction; on an error nothing changes and a later call
// hands the same events out again, with the same event ids. It returns how
// many events it relayed.
func (s *Store) RelayResults(ctx context.Context, max int, publish func([]ResultEvent) ([]WebhookDelivery, error)) (int, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("relay results: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	events, err := takeResultEvents(ctx, tx, max)
	if err != nil || len(events) == 0 {
		return 0, err
	}
	deliveries, err := publish(events)
	if err != nil {
		return 0, err
	}
	if err := insertWebhookDeliveries(ctx, tx, deliveries); err != nil {
		return 0, err
	}
	seqs := make([]int64, len(events))
	for i, e := range events {
		seqs[i] = e.Seq
	}
	if _, err := tx.Exec(ctx, `DELETE FROM result_events WHERE seq = ANY($1)`, seqs); err != nil {
		return 0, fmt.Errorf("relay results: delete %d events: %w", len(events), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("relay results: commit: %w", err)
	}
	return len(events), nil
}

func takeResultEvents(ctx context.Context, tx pgx.Tx, max int) ([]ResultEvent, error) {
	rows, err := tx.Query(ctx, `SELECT seq, event_id::text, occurred_at, job FROM result_events
		ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`, max)
	if err != nil {
		return nil, fmt.Errorf("relay results: read outbox: %w", err)
	}
	var (
		out  []ResultEvent
		e    ResultEvent
		snap []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&e.Seq, &e.EventID, &e.OccurredAt, &snap}, func() error {
		var s snapshot
		if err := json.Unmarshal(snap, &s); err != nil {
			return fmt.Errorf("decode outbox event %d: %w", e.Seq, err)
		}
		e.OccurredAt = e.OccurredAt.UTC()
		e.Job = s.record()
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("relay results: read outbox: %w", err)
	}
	return out, nil
}

func insertWebhookDeliveries(ctx context.Context, tx pgx.Tx, ds []WebhookDelivery) error {
	if len(ds) == 0 {
		return nil
	}
	n := len(ds)
	eventIDs, tenants, jobIDs, urls := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	payloads := make([][]byte, n)
	for i, d := range ds {
		eventIDs[i], tenants[i], jobIDs[i], urls[i], payloads[i] = d.EventID, d.Tenant, d.JobID, d.URL, d.Payload
	}
	// A relay that published, stored these and then failed to commit left
	// nothing; one that committed deleted the events. ON CONFLICT covers a
	// repeat within one batch (the same endpoint twice).
	_, err := tx.Exec(ctx, `INSERT INTO webhook_deliveries (event_id, tenant, job_id, url, payload, next_attempt_at)
		SELECT u.event_id::uuid, u.tenant, u.job_id, u.url, u.payload, now()
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[]) AS u(event_id, tenant, job_id, url, payload)
		ON CONFLICT (event_id, url) DO NOTHING`, eventIDs, tenants, jobIDs, urls, payloads)
	if err != nil {
		return fmt.Errorf("relay results: store %d webhook deliveries: %w", n, err)
	}
	return nil
}

// PendingResults is the outbox's length and the age of its oldest event
// (zero when empty): how far the relay is behind.
func (s *Store) PendingResults(ctx context.Context) (n int64, oldest time.Duration, err error) {
	var age *float64
	err = s.pool.QueryRow(ctx, `SELECT count(*), extract(epoch FROM now() - min(occurred_at))::float8 FROM result_events`).Scan(&n, &age)
	if err != nil {
		return 0, 0, fmt.Errorf("pending results: %w", err)
	}
	if age != nil {
		oldest = time.Duration(*age * float64(time.Second))
	}
	return n, oldest, nil
}
