package reconcile

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// reasonDeliveryLimit is the reason a job's row and dead letter give when
// the broker dead-lettered its message.
const reasonDeliveryLimit = "delivery limit: the message was handed back too often (shutdowns, scale-downs, store errors)"

// drainDeadLetters records every message of the broker's dead-letter
// queues until ctx ends. A batch leaves the queue only once every dead
// letter of it is recorded; a store error leaves it there for the next try.
func (r *Reconciler) drainDeadLetters(ctx context.Context) {
	// A reader in a consumer group (Kafka's) holds its share of the
	// partitions until it leaves: the next leader would not read them.
	if s, ok := r.deps.DeadLetters.(interface{ StopDraining() }); ok {
		defer s.StopDraining()
	}
	for {
		err := r.deps.DeadLetters.DrainDeadLetters(ctx, 100, func(dls []broker.DeadLetter) error {
			for _, dl := range dls {
				if err := r.recordBrokerDeadLetter(ctx, dl); err != nil {
					return err
				}
			}
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.log.Warn("reconciler: broker dead letters stay queued; will retry", "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(r.cfg.Interval):
			}
		}
	}
}

// recordBrokerDeadLetter makes one broker dead letter visible in
// dead_letters: a lane message's job moves to dead (unless it finished, or
// another delivery of it is running); an intake message that never became
// a job is kept as a message; an envelope llmq wrote itself (older
// versions published one per dead job) is stored as its job's dead letter.
// It returns an error only when the store could not be reached: the dead
// letter is then kept in the broker's queue.
func (r *Reconciler) recordBrokerDeadLetter(ctx context.Context, dl broker.DeadLetter) error {
	key, keyErr := job.ReadKey(dl.Body)
	lane := dl.Lane
	if !lane.Valid() {
		lane = job.PriorityNormal
	}
	row := store.DeadLetterRow{Tenant: key.Tenant, JobID: key.ID, Lane: string(lane), Reason: dl.Reason,
		Attempts: dl.Attempts, LastError: dl.LastError, Body: dl.Body, FirstFailedAt: dl.FirstFailedAt, LastFailedAt: dl.LastFailedAt}
	vouched := ""
	if dl.FromIntake {
		// Never judged: the broker identity decides whose it is, as the
		// ingester would have, so that a body cannot file itself (or be
		// replayed as a job) under a tenant that takes raw publishes only
		// from its own broker users.
		tenant, refusal, fileUnder := r.identity.TenantOf(broker.Message{Body: dl.Body, UserID: dl.UserID})
		if refusal == "" && tenant == "" && keyErr == nil && r.identity.Guarded(key.Tenant) {
			// ReadKey reads field names as encoding/json does, in any case:
			// a tenant it reads is the claim the rule refuses.
			refusal, fileUnder = fmt.Sprintf(broker.ReasonIdentityRequired, key.Tenant, key.Tenant), job.DefaultTenant
		}
		if refusal != "" {
			row.Tenant, row.JobID, row.Kind = fileUnder, "", store.DeadLetterMessage
			row.Reason = refusal + "; " + intakeDeathReason(dl.Reason)
			return r.record(ctx, row, "broker_dead_letter")
		}
		vouched = tenant
		if keyErr == nil && vouched != "" {
			key.Tenant, row.Tenant = vouched, vouched
		}
	}
	if keyErr != nil {
		row.Tenant, row.JobID, row.Kind = cmp.Or(vouched, job.DefaultTenant), "", store.DeadLetterMessage
		return r.record(ctx, row, "broker_dead_letter")
	}
	if dl.Reason != broker.ReasonDeliveryLimit && !dl.FromIntake {
		return r.record(ctx, row, "broker_dead_letter")
	}
	rec, err := r.deps.Store.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		// An intake message that died before it was stored: handed back
		// too often, or expired or refused by the queue.
		row.Kind, row.Reason = store.DeadLetterMessage, intakeDeathReason(dl.Reason)
		if dl.Reason != broker.ReasonDeliveryLimit {
			return r.record(ctx, row, "broker_dead_letter")
		}
		return r.record(ctx, row, "delivery_limit")
	}
	if err != nil {
		return fmt.Errorf("read job %s of a broker dead letter: %w", key.ID, err)
	}
	if dl.FromIntake {
		return nil // the job was stored; its own lane message carries it on
	}
	row.Reason = reasonDeliveryLimit
	row.Body, _ = json.Marshal(rec.Job)
	ok, err := r.deps.Store.DeadByBroker(ctx, key, store.AttemptError{Kind: "delivery_limit", Model: rec.Model, Message: reasonDeliveryLimit}, row)
	switch {
	case err != nil:
		return fmt.Errorf("dead-letter job %s: %w", key.ID, err)
	case ok:
		r.repaired.WithLabelValues("delivery_limit").Inc()
		r.log.Warn("reconciler: job dead, the broker dead-lettered its message", "tenant", key.Tenant, "job_id", key.ID)
	default:
		r.log.Info("reconciler: broker dead letter of a job that finished or is running; dropped", "tenant", key.Tenant, "job_id", key.ID, "status", string(rec.Status))
	}
	return nil
}

// intakeDeathReason is the reason a message the broker dead-lettered from
// the intake is recorded with.
func intakeDeathReason(reason string) string {
	if reason == broker.ReasonDeliveryLimit {
		return reasonDeliveryLimit + " before it was stored"
	}
	return reason
}

func (r *Reconciler) record(ctx context.Context, row store.DeadLetterRow, reason string) error {
	if _, err := r.deps.Store.RecordDeadLetter(ctx, row); err != nil {
		return fmt.Errorf("record broker dead letter of job %q: %w", row.JobID, err)
	}
	r.repaired.WithLabelValues(reason).Inc()
	return nil
}
