package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// reasonDeliveryLimit is the reason a job's row and dead letter give when
// the broker dead-lettered its message.
const reasonDeliveryLimit = "delivery limit: the message was handed back too often (shutdowns, scale-downs, store errors)"

// drainDeadLetters records every message of the broker's dead-letter
// queues until ctx ends.
func (r *Reconciler) drainDeadLetters(ctx context.Context) {
	for {
		dls, err := r.deps.DeadLetters.ReadDeadLetters(ctx, 100)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.log.Warn("reconciler: read broker dead letters", "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(r.cfg.Interval):
			}
			continue
		}
		for _, dl := range dls {
			r.recordBrokerDeadLetter(ctx, dl)
		}
	}
}

// recordBrokerDeadLetter makes one broker dead letter visible in
// dead_letters: a lane message's job moves to dead (unless it finished, or
// another delivery of it is running); an intake message that never became
// a job is kept as a message; an envelope llmq wrote itself (older
// versions published one per dead job) is stored as its job's dead letter.
func (r *Reconciler) recordBrokerDeadLetter(ctx context.Context, dl broker.DeadLetter) {
	key, keyErr := job.ReadKey(dl.Body)
	lane := dl.Lane
	if !lane.Valid() {
		lane = job.PriorityNormal
	}
	row := store.DeadLetterRow{Tenant: key.Tenant, JobID: key.ID, Lane: string(lane), Reason: dl.Reason,
		Attempts: dl.Attempts, LastError: dl.LastError, Body: dl.Body, FirstFailedAt: dl.FirstFailedAt, LastFailedAt: dl.LastFailedAt}
	if keyErr != nil {
		row.Tenant, row.JobID, row.Kind = job.DefaultTenant, "", store.DeadLetterMessage
		r.record(ctx, row, "broker_dead_letter")
		return
	}
	if dl.Reason != broker.ReasonDeliveryLimit {
		r.record(ctx, row, "broker_dead_letter")
		return
	}
	rec, err := r.deps.Store.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		// An intake message handed back too often before it was stored.
		row.Kind, row.Reason = store.DeadLetterMessage, reasonDeliveryLimit+" before it was stored"
		r.record(ctx, row, "delivery_limit")
		return
	}
	if err != nil {
		r.log.Error("reconciler: read job of a broker dead letter; its message is dropped", "job_id", key.ID, "error", err)
		return
	}
	if dl.FromIntake {
		return // the job was stored; its own lane message carries it on
	}
	row.Reason = reasonDeliveryLimit
	row.Body, _ = json.Marshal(rec.Job)
	ok, err := r.deps.Store.DeadByBroker(ctx, key, store.AttemptError{Kind: "delivery_limit", Model: rec.Model, Message: reasonDeliveryLimit}, row)
	switch {
	case err != nil:
		r.log.Error("reconciler: dead-letter job", "job_id", key.ID, "error", err)
	case ok:
		r.repaired.WithLabelValues("delivery_limit").Inc()
		r.log.Warn("reconciler: job dead, the broker dead-lettered its message", "tenant", key.Tenant, "job_id", key.ID)
	default:
		r.log.Info("reconciler: broker dead letter of a job that finished or is running; dropped", "tenant", key.Tenant, "job_id", key.ID, "status", string(rec.Status))
	}
}

func (r *Reconciler) record(ctx context.Context, row store.DeadLetterRow, reason string) {
	if _, err := r.deps.Store.RecordDeadLetter(ctx, row); err != nil {
		r.log.Error("reconciler: record broker dead letter", "job_id", row.JobID, "error", err)
		return
	}
	r.repaired.WithLabelValues(reason).Inc()
}
