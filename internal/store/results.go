package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	// PutOff is how many times the broker refused the event on its own
	// (PutOff) before this round.
	PutOff int
	// Job is the job's row without its request, read when the event is
	// taken; its status and completed_at are the event's.
	Job Record
}

// QueuedWebhook is one webhook to send for a result event, as the relay
// stores it for the dispatcher (a claimed one is a WebhookDelivery).
type QueuedWebhook struct {
	EventID, Tenant, JobID, URL string
	// Payload is the exact body signed and sent on every attempt.
	Payload []byte
	// TraceParent and TraceState are the job's trace context, the parent
	// of each attempt's span (docs/design.md#tracing); empty when none.
	TraceParent, TraceState string
}

// RelayResults takes up to max outbox events, oldest first, that no other
// relay holds (FOR UPDATE SKIP LOCKED: replicas share the outbox without
// waiting on each other), and hands to publish those that wants keeps.
// wants sees each event's routing fields only (Job holds the tenant, id,
// priority, status, completed_at and the destinations: reply_to,
// correlation_id, callback_url, result_topic); the events it keeps are read
// in full, without the request, before publish sees them. An event nobody
// hears (no binding, no destination) is never read in full, nor encoded.
// When publish returns nil, the webhook deliveries it returns are stored
// and every event taken is deleted, in the same transaction; on an error
// nothing changes and a later call hands the same events out again, with
// the same event ids. It returns how many events it relayed or skipped.
//
// The store's timeout bounds the reads before publish and the writes
// after it, each on their own; publish bounds itself (the relay's
// PublishTimeout): sharing one timeout, a round slow to confirm was
// rolled back after its events went out, every time.
func (s *Store) RelayResults(ctx context.Context, max int, wants func(ResultEvent) bool, publish func([]ResultEvent) ([]QueuedWebhook, error)) (int, error) {
	rctx, stop := s.bound(ctx)
	defer stop()
	tx, err := s.pool.Begin(rctx)
	if err != nil {
		return 0, fmt.Errorf("relay results: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	events, err := takeResultEvents(rctx, tx, max)
	if err != nil || len(events) == 0 {
		return 0, err
	}
	var heard []ResultEvent
	for _, e := range events {
		if wants(e) {
			heard = append(heard, e)
		}
	}
	if heard, err = readEventJobs(rctx, tx, heard); err != nil {
		return 0, err
	}
	stop()
	deliveries, err := publish(heard)
	ctx, stop = s.bound(ctx)
	defer stop()
	var putOff *PutOff
	if errors.As(err, &putOff) {
		deliveries, err = putOff.Webhooks, nil
	}
	if err != nil {
		tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
		// The jobs are finished all the same: their long-polls answer now,
		// not when the broker is back.
		s.notifyFinished(ctx, events)
		return 0, err
	}
	if err := insertWebhookDeliveries(ctx, tx, deliveries); err != nil {
		return 0, err
	}
	var seqs, later, again []int64
	if putOff != nil {
		later, again = seqsAt(heard, putOff.Events), seqsAt(heard, putOff.Again)
	}
	for _, e := range events {
		if !slices.Contains(later, e.Seq) && !slices.Contains(again, e.Seq) {
			seqs = append(seqs, e.Seq)
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM result_events WHERE seq = ANY($1)`, seqs); err != nil {
		return 0, fmt.Errorf("relay results: delete %d events: %w", len(events), err)
	}
	if len(later) > 0 {
		if _, err := tx.Exec(ctx, putOffSQL, later); err != nil {
			return 0, fmt.Errorf("relay results: put off %d events: %w", len(later), err)
		}
	}
	if len(again) > 0 {
		if _, err := tx.Exec(ctx, againSQL, again); err != nil {
			return 0, fmt.Errorf("relay results: put off %d events: %w", len(again), err)
		}
	}
	if _, err := tx.Exec(ctx, notifyFinishedSQL, FinishedChannel, finishedPayloads(events)); err != nil {
		return 0, fmt.Errorf("relay results: notify: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("relay results: commit: %w", err)
	}
	return len(seqs), nil
}

// PutOff is what RelayResults's publish returns when the broker refused
// some events on their own: Events are indexes into the events publish was
// given, tried again after a backoff (putOffSQL); every other event taken
// is deleted, and Webhooks are stored, as on success.
type PutOff struct {
	Events []int
	// Again are events the broker did not refuse but had no time to take
	// (broker.ErrOutOfTime): tried again a second later, the refusals
	// they count toward the give-up unchanged.
	Again    []int
	Webhooks []QueuedWebhook
}

func (p *PutOff) Error() string {
	return fmt.Sprintf("relay results: %d events put off", len(p.Events)+len(p.Again))
}

// seqsAt is the seqs of events at the indexes idx.
func seqsAt(events []ResultEvent, idx []int) []int64 {
	seqs := make([]int64, 0, len(idx))
	for _, i := range idx {
		seqs = append(seqs, events[i].Seq)
	}
	return seqs
}

// putOffSQL puts events ($1, their seqs) off: one second after the first
// refusal, doubling to at most a minute.
const putOffSQL = `UPDATE result_events SET attempts = attempts + 1,
	next_attempt_at = now() + least(interval '1 second' * power(2, least(attempts, 20)), interval '1 minute')
	WHERE seq = ANY($1)`

// againSQL puts events ($1, their seqs) off for a second without counting
// a refusal (PutOff.Again).
const againSQL = `UPDATE result_events SET next_attempt_at = now() + interval '1 second' WHERE seq = ANY($1)`

// notifyFinished tells long-polls the events' jobs finished, outside the
// relay's transaction (which the broker's failure rolled back), as far as
// Postgres can be reached.
func (s *Store) notifyFinished(ctx context.Context, events []ResultEvent) {
	ctx, stop := s.bound(context.WithoutCancel(ctx))
	defer stop()
	_, _ = s.pool.Exec(ctx, notifyFinishedSQL, FinishedChannel, finishedPayloads(events))
}

// notifyFinishedSQL sends each payload ($2) on the channel $1.
const notifyFinishedSQL = `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`

// FinishedChannel is the channel the relay notifies, at its commit, of the
// jobs whose events it published (long-polls listen on it). A payload is
// one line "<priority> <tenant> <id>" per job (none of the three holds a
// space or a newline), at most maxPayload bytes; a round sends as many
// payloads as it needs. The relay notifies rather than the trigger that
// fills the outbox: a NOTIFY holds a database-wide lock through its
// transaction's commit, which serialised the workers' commits.
const FinishedChannel = "llmq_job_finished"

// maxPayload keeps a notification under Postgres's 8000-byte limit.
const maxPayload = 7900

func finishedPayloads(events []ResultEvent) []string {
	var out []string
	var b strings.Builder
	for _, e := range events {
		line := string(e.Job.Priority) + " " + e.Job.Tenant + " " + e.Job.ID
		if b.Len() > 0 && b.Len()+1+len(line) > maxPayload {
			out = append(out, b.String())
			b.Reset()
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(line)
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out
}

// relayColumns is jobColumns with the request left out: the relay never
// sends it, and it can be a megabyte.
var relayColumns = strings.Replace(qualifiedJobColumns, "jobs.request", "NULL::jsonb AS request", 1)

// takeResultEvents locks up to max outbox events and reads, of each job,
// what RelayResults's wants looks at.
func takeResultEvents(ctx context.Context, tx pgx.Tx, max int) ([]ResultEvent, error) {
	rows, err := tx.Query(ctx, `SELECT e.seq, e.event_id::text, e.status, e.occurred_at, e.attempts, jobs.tenant, jobs.id, jobs.priority,
			jobs.reply_to, jobs.correlation_id, jobs.callback_url, jobs.result_topic
		FROM result_events e JOIN jobs ON jobs.tenant = e.tenant AND jobs.id = e.job_id
		WHERE e.next_attempt_at IS NULL OR e.next_attempt_at <= now()
		ORDER BY e.seq LIMIT $1 FOR UPDATE OF e SKIP LOCKED`, max)
	if err != nil {
		return nil, fmt.Errorf("relay results: read outbox: %w", err)
	}
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ResultEvent, error) {
		var (
			e                                ResultEvent
			status, priority                 string
			replyTo, corrID, callback, topic *string
		)
		err := row.Scan(&e.Seq, &e.EventID, &status, &e.OccurredAt, &e.PutOff, &e.Job.Tenant, &e.Job.ID, &priority,
			&replyTo, &corrID, &callback, &topic)
		at := e.OccurredAt.UTC()
		e.OccurredAt = at
		e.Job.Status, e.Job.CompletedAt, e.Job.Priority = job.Status(status), &at, job.Priority(priority)
		e.Job.ReplyTo, e.Job.CorrelationID, e.Job.CallbackURL, e.Job.ResultTopic = deref(replyTo), deref(corrID), deref(callback), deref(topic)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("relay results: read outbox: %w", err)
	}
	return events, nil
}

// readEventJobs reads the job of each event in full (without its request),
// as it finished: a job replayed and moving again since keeps the status
// and completed_at of its event. An event whose job was deleted since the
// outbox was read is left out: its event is dropped, as DropOrphanResults
// would have dropped it a moment later.
func readEventJobs(ctx context.Context, tx pgx.Tx, events []ResultEvent) ([]ResultEvent, error) {
	if len(events) == 0 {
		return nil, nil
	}
	keys := make([]job.Key, len(events))
	for i, e := range events {
		keys[i] = e.Job.Key()
	}
	byKey, err := readMany(ctx, tx, relayColumns, keys)
	if err != nil {
		return nil, fmt.Errorf("relay results: read %d jobs: %w", len(events), err)
	}
	out := events[:0]
	for i, e := range events {
		rec, ok := byKey[keys[i]]
		if !ok {
			continue
		}
		if rec.Status != e.Job.Status || rec.CompletedAt == nil || !rec.CompletedAt.Equal(e.OccurredAt) {
			rec.Status, rec.CompletedAt = e.Job.Status, e.Job.CompletedAt
		}
		e.Job = rec
		out = append(out, e)
	}
	return out, nil
}

func insertWebhookDeliveries(ctx context.Context, tx pgx.Tx, ds []QueuedWebhook) error {
	if len(ds) == 0 {
		return nil
	}
	n := len(ds)
	eventIDs, tenants, jobIDs, urls := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	payloads := make([][]byte, n)
	traceParents, traceStates := make([]*string, n), make([]*string, n)
	for i, d := range ds {
		eventIDs[i], tenants[i], jobIDs[i], urls[i], payloads[i] = d.EventID, d.Tenant, d.JobID, d.URL, d.Payload
		traceParents[i], traceStates[i] = nullIfEmpty(d.TraceParent), nullIfEmpty(d.TraceState)
	}
	// A relay that published, stored these and then failed to commit left
	// nothing; one that committed deleted the events. ON CONFLICT covers a
	// repeat within one batch (the same endpoint twice).
	_, err := tx.Exec(ctx, `INSERT INTO webhook_deliveries (event_id, tenant, job_id, url, payload, next_attempt_at, traceparent, tracestate)
		SELECT u.event_id::uuid, u.tenant, u.job_id, u.url, u.payload, now(), u.traceparent, u.tracestate
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::text[])
			AS u(event_id, tenant, job_id, url, payload, traceparent, tracestate)
		ON CONFLICT (event_id, url) DO NOTHING`, eventIDs, tenants, jobIDs, urls, payloads, traceParents, traceStates)
	if err != nil {
		return fmt.Errorf("relay results: store %d webhook deliveries: %w", n, err)
	}
	return nil
}

// DropOrphanResults deletes outbox events whose job row no longer exists
// (deleted by an operator or, later, by retention): the relay joins each
// event with its job and would pass such an event over for ever, and the
// outbox's age, which alerts, would only grow. It returns how many it
// dropped.
func (s *Store) DropOrphanResults(ctx context.Context) (int64, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	tag, err := s.pool.Exec(ctx, `DELETE FROM result_events e
		WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.tenant = e.tenant AND jobs.id = e.job_id)`)
	if err != nil {
		return 0, fmt.Errorf("drop orphan result events: %w", err)
	}
	return tag.RowsAffected(), nil
}

// HasResultEvents reports whether the outbox holds an event that is due
// (not put off, PutOff).
func (s *Store) HasResultEvents(ctx context.Context) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var any bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM result_events WHERE next_attempt_at IS NULL OR next_attempt_at <= now())`).Scan(&any); err != nil {
		return false, fmt.Errorf("result events: %w", err)
	}
	return any, nil
}

// PendingResults is the outbox's length and the age of its oldest event
// (zero when empty): how far the relay is behind.
func (s *Store) PendingResults(ctx context.Context) (n int64, oldest time.Duration, err error) {
	ctx, stop := s.bound(ctx)
	defer stop()
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
