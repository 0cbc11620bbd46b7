// Package reconcile keeps Postgres and the broker in step. The job row is
// the record of a job and its broker message only a wake-up; the
// Reconciler repairs what can drift between them:
//
//   - a job with no message (enqueued_at NULL: a retry whose publish the
//     broker refused, a DLQ replay whose publish did not follow its
//     commit): published at once, or when due for a retry;
//   - a job a dead replica took directly from the intake (running, no
//     message, its lease expired): published at once, whatever the lane
//     holds, and claimed by whoever receives it;
//   - a lost message (a purged queue, a crash between a commit and its
//     publish, a retry's delay message gone, a running job's lease expired
//     with no redelivery): when a lane has no message waiting, its queued
//     jobs whose message went out more than LostAfter ago, its retries due
//     since then and its leases expired since then are published again (a
//     duplicate message is harmless: a claim runs a job once);
//   - every message in the broker's dead-letter queues (llmq.jobs.dead,
//     llmq.jobs.dlq): recorded in dead_letters, its job moved to dead;
//   - queued jobs of a model models: no longer lists: failed with the
//     reason and dead-lettered.
//
// One reconciler is active among the consumer replicas: the one that holds
// a Postgres advisory lock (store.TryLead); the others try again every
// Interval and take over within one when the active one's session ends.
package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// Store is what the reconciler needs from internal/store.
type Store interface {
	TryLead(ctx context.Context, id int64) (*store.Lease, error)
	TakeUnenqueued(ctx context.Context, limit int) ([]store.Record, error)
	TakeOrphaned(ctx context.Context, limit int) ([]store.Record, error)
	MarkUnenqueued(ctx context.Context, key job.Key) error
	Stale(ctx context.Context, lane job.Priority, after time.Duration, limit int) ([]store.Record, error)
	MarkEnqueued(ctx context.Context, keys []job.Key) error
	Unconfigured(ctx context.Context, models []string, limit int) ([]store.Record, error)
	FailQueued(ctx context.Context, key job.Key, e store.AttemptError, dl store.DeadLetterRow) (bool, error)
	DeadByBroker(ctx context.Context, key job.Key, e store.AttemptError, dl store.DeadLetterRow) (bool, error)
	RecordDeadLetter(ctx context.Context, dl store.DeadLetterRow) (int64, error)
	Get(ctx context.Context, key job.Key) (store.Record, error)
}

var _ Store = (*store.Store)(nil)

// Config tunes a Reconciler.
type Config struct {
	// Interval between sweeps, and between tries to become the active
	// reconciler (default 1s).
	Interval time.Duration
	// LostAfter is how long a message may go unconsumed, while its lane has
	// nothing waiting, before it counts as lost (default 30s).
	LostAfter time.Duration
	// Batch bounds the jobs repaired per sweep (default 500).
	Batch int
	// Models are the configured model names; when set, queued jobs of
	// other models are failed.
	Models []string
	// ModelCheckEvery is how often that check runs (default 1m).
	ModelCheckEvery time.Duration
	// OrphanEvery is how often the sweep looks for running jobs with no
	// message whose lease expired (default, or at most Interval: every
	// sweep). Such a job has already waited out a lease, so a tenth of the
	// lease adds little to its wait, while each look reads every tenant's
	// running range of jobs_list_status_idx, dead entries included: 7-10 ms
	// a look under the side-by-side's load (BENCHMARKS.md).
	OrphanEvery time.Duration
	// BrokerUsers maps broker users to their tenants, as the ingester's
	// (ingest.Config.BrokerUsers): an intake message the broker
	// dead-lettered before it was stored is filed under the tenant the
	// rule gives it, not the one its body claims.
	BrokerUsers map[string]string
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.LostAfter <= 0 {
		c.LostAfter = 30 * time.Second
	}
	if c.Batch <= 0 {
		c.Batch = 500
	}
	if c.ModelCheckEvery <= 0 {
		c.ModelCheckEvery = time.Minute
	}
	return c
}

// Deps are the reconciler's collaborators.
type Deps struct {
	Store Store
	// Lanes publishes repaired jobs to their lanes.
	Lanes broker.Publisher
	// Depth tells whether a lane has messages waiting.
	Depth broker.Inspector
	// DeadLetters reads the broker's dead-letter queues (nil: not read).
	DeadLetters broker.DeadLetterReader
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
}

// Reconciler is described in the package doc. Create with New, run with Run.
type Reconciler struct {
	cfg      Config
	deps     Deps
	log      *slog.Logger
	repaired *prometheus.CounterVec
	leader   prometheus.Gauge
	identity broker.Identity
}

// New builds a reconciler.
func New(cfg Config, deps Deps) (*Reconciler, error) {
	if deps.Store == nil || deps.Lanes == nil || deps.Depth == nil {
		return nil, errors.New("reconcile: Store, Lanes and Depth are required")
	}
	r := &Reconciler{cfg: cfg.WithDefaults(), deps: deps, log: deps.Logger, identity: broker.NewIdentity(cfg.BrokerUsers),
		repaired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_reconciler_repaired_total",
			Help: "Drift the reconciler repaired, by reason: no_message, orphaned, lost_queued, overdue_retry, expired_lease, delivery_limit, broker_dead_letter, unknown_model.",
		}, []string{"reason"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_reconciler_active",
			Help: "1 while this replica is the active reconciler.",
		}),
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if deps.Registerer != nil {
		for _, c := range []prometheus.Collector{r.repaired, r.leader} {
			if err := deps.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("reconcile: register metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Run tries to become the active reconciler every Interval and, while it
// is, sweeps every Interval and drains the broker's dead-letter queues. It
// returns nil when ctx ends.
func (r *Reconciler) Run(ctx context.Context) error {
	tick := time.NewTicker(r.cfg.Interval)
	defer tick.Stop()
	for {
		lease, err := r.deps.Store.TryLead(ctx, store.ReconcilerLockID)
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.Warn("reconciler: try to lead", "error", err)
		case lease != nil:
			r.lead(ctx, lease, tick)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// lead runs the active reconciler until ctx ends or the lease is lost.
func (r *Reconciler) lead(ctx context.Context, lease *store.Lease, tick *time.Ticker) {
	defer lease.Release(context.WithoutCancel(ctx))
	r.leader.Set(1)
	defer r.leader.Set(0)
	r.log.Info("reconciler active")
	leadCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	if r.deps.DeadLetters != nil {
		wg.Go(func() { r.drainDeadLetters(leadCtx) })
	}
	var lastModelCheck, lastOrphans time.Time
	for {
		if err := lease.Check(ctx); err != nil {
			if ctx.Err() == nil {
				r.log.Warn("reconciler lease lost", "error", err)
			}
			return
		}
		orphans := r.cfg.OrphanEvery <= r.cfg.Interval || time.Since(lastOrphans) >= r.cfg.OrphanEvery
		if orphans {
			lastOrphans = time.Now()
		}
		r.sweep(ctx, orphans)
		if len(r.cfg.Models) > 0 && time.Since(lastModelCheck) >= r.cfg.ModelCheckEvery {
			r.failUnconfigured(ctx)
			lastModelCheck = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Sweep runs one pass of the repairs that need no broker dead-letter
// reading (for tests and for callers that run it on their own schedule).
func (r *Reconciler) Sweep(ctx context.Context) {
	r.sweep(ctx, true)
	if len(r.cfg.Models) > 0 {
		r.failUnconfigured(ctx)
	}
}

// sweep runs one pass; orphans includes the look for orphaned running jobs.
func (r *Reconciler) sweep(ctx context.Context, orphans bool) {
	recs, err := r.deps.Store.TakeUnenqueued(ctx, r.cfg.Batch)
	if err != nil {
		r.log.Warn("reconciler: find jobs without a message", "error", err)
	} else {
		r.publishTaken(ctx, recs, "no_message")
	}
	// A dead replica's jobs taken directly from the intake: running under
	// an expired lease, with no message to wake them.
	if orphans {
		if recs, err = r.deps.Store.TakeOrphaned(ctx, r.cfg.Batch); err != nil {
			r.log.Warn("reconciler: find orphaned running jobs", "error", err)
		} else {
			r.publishTaken(ctx, recs, "orphaned")
		}
	}
	for _, lane := range job.Priorities {
		depth, err := r.deps.Depth.Depth(ctx, lane)
		if err != nil {
			r.log.Warn("reconciler: lane depth", "lane", string(lane), "error", err)
			continue
		}
		if depth > 0 {
			continue // the lost cannot be told from the waiting
		}
		recs, err := r.deps.Store.Stale(ctx, lane, r.cfg.LostAfter, r.cfg.Batch)
		if err != nil {
			r.log.Warn("reconciler: find stale jobs", "lane", string(lane), "error", err)
			continue
		}
		r.publish(ctx, recs, staleReason)
	}
}

func staleReason(rec store.Record) string {
	switch rec.Status {
	case job.StatusQueued:
		return "lost_queued"
	case job.StatusRetrying:
		return "overdue_retry"
	}
	return "expired_lease"
}

// publish sends each job's message to its lane and records that it did.
func (r *Reconciler) publish(ctx context.Context, recs []store.Record, reason func(store.Record) string) {
	done, _ := r.publishEach(ctx, recs, reason)
	if err := r.deps.Store.MarkEnqueued(ctx, done); err != nil {
		// Unmarked jobs are published again by a later sweep: a duplicate.
		r.log.Warn("reconciler: mark jobs enqueued", "jobs", len(done), "error", err)
	}
}

// publishTaken sends each job's message to its lane; the rows are marked
// enqueued already (TakeUnenqueued, TakeOrphaned), so a failed publish
// unmarks its row for a later sweep.
func (r *Reconciler) publishTaken(ctx context.Context, recs []store.Record, reason string) {
	_, failed := r.publishEach(ctx, recs, func(store.Record) string { return reason })
	for _, key := range failed {
		if err := r.deps.Store.MarkUnenqueued(ctx, key); err != nil {
			// Marked enqueued with no message: the stale sweep finds it
			// after lost_after.
			r.log.Warn("reconciler: unmark job", "job_id", key.ID, "error", err)
		}
	}
}

// publishEach publishes a wake-up for each job and counts the repair; it
// returns the keys it published and those it could not.
func (r *Reconciler) publishEach(ctx context.Context, recs []store.Record, reason func(store.Record) string) (done, failed []job.Key) {
	for _, rec := range recs {
		if err := r.deps.Lanes.Publish(ctx, rec.Priority, broker.WakeUp(rec.Key(), rec.Model)); err != nil {
			r.log.Warn("reconciler: publish job", "job_id", rec.ID, "lane", string(rec.Priority), "error", err)
			failed = append(failed, rec.Key())
			continue
		}
		done = append(done, rec.Key())
		r.repaired.WithLabelValues(reason(rec)).Inc()
		r.log.Info("reconciler: job re-published", "tenant", rec.Tenant, "job_id", rec.ID, "status", string(rec.Status), "reason", reason(rec))
	}
	return done, failed
}

// failUnconfigured fails the queued jobs of models that models: no longer
// lists.
func (r *Reconciler) failUnconfigured(ctx context.Context) {
	recs, err := r.deps.Store.Unconfigured(ctx, r.cfg.Models, r.cfg.Batch)
	if err != nil {
		r.log.Warn("reconciler: find jobs of unconfigured models", "error", err)
		return
	}
	for _, rec := range recs {
		reason := fmt.Sprintf("invalid job: model: %q is not a configured model", rec.Model)
		body, _ := json.Marshal(rec.Job)
		dl := store.DeadLetterRow{Tenant: rec.Tenant, JobID: rec.ID, Lane: string(rec.Priority), Reason: reason, Body: body}
		ok, err := r.deps.Store.FailQueued(ctx, rec.Key(), store.AttemptError{Kind: "invalid", Model: rec.Model, Message: reason}, dl)
		if err != nil {
			r.log.Warn("reconciler: fail job of an unconfigured model", "job_id", rec.ID, "error", err)
			continue
		}
		if ok {
			r.repaired.WithLabelValues("unknown_model").Inc()
			r.log.Warn("reconciler: job failed, its model is not configured", "tenant", rec.Tenant, "job_id", rec.ID, "model", rec.Model)
		}
	}
}
