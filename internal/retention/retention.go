// Package retention deletes what llmq no longer needs (docs/design.md#retention):
// finished jobs once their status's retention has passed, with their job
// dead letters and webhook deliveries; message dead letters; usage_hours
// rows; the tombstones that keep a deleted job's id known for the
// idempotency window; and the records of finished provider batches once no
// job they ran can still be kept (batchRetention).
//
// It deletes in small batches with a pause between them, so that a large
// backlog of expired rows (the first run on an old database) is worked off
// without taking the hot path's locks, I/O or WAL for long. One sweeper is
// active among the consumer replicas: the one that holds a Postgres
// advisory lock (store.TryLead, store.RetentionLockID).
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// Store is what the sweeper needs from internal/store.
type Store interface {
	TryLead(ctx context.Context, id int64) (*store.Lease, error)
	JobTenants(ctx context.Context) ([]string, error)
	ExpireJobs(ctx context.Context, tenant string, st job.Status, cutoff, now time.Time, limit int) (int, error)
	ExpireMessageDeadLetters(ctx context.Context, cutoff time.Time, limit int) (int, error)
	ExpireTombstones(ctx context.Context, cutoff time.Time, limit int) (int, error)
	ExpireUsage(ctx context.Context, cutoff time.Time, limit int) (int, error)
	ExpireBatches(ctx context.Context, cutoff time.Time, limit int) (int, error)
}

var _ Store = (*store.Store)(nil)

// Policy is how long each finished status is kept.
type Policy map[job.Status]time.Duration

// Config is the sweeper's settings (config.Retention, built in
// internal/launch).
type Config struct {
	// Jobs is the retention of each finished status; a status absent or
	// zero is never deleted.
	Jobs Policy
	// Tenants overrides Jobs per tenant and status (zero: Jobs applies).
	Tenants map[string]Policy
	// Idempotency is how long a deleted job's tombstone is kept.
	Idempotency time.Duration
	// Usage is how long usage_hours rows are kept (zero: for ever).
	Usage time.Duration
	// Interval is the sweep period, Batch the rows per DELETE, Pause the
	// rest between batches.
	Interval time.Duration
	Batch    int
	Pause    time.Duration
}

// Sweeper is described in the package doc. Create with New, run with Run
// or drive with Sweep.
type Sweeper struct {
	cfg     Config
	st      Store
	log     *slog.Logger
	now     func() time.Time
	deleted *prometheus.CounterVec
	leader  prometheus.Gauge
}

// New builds a sweeper. now is its clock (time.Now when nil); log and reg
// may be nil.
func New(cfg Config, st Store, now func() time.Time, log *slog.Logger, reg prometheus.Registerer) (*Sweeper, error) {
	if st == nil {
		return nil, errors.New("retention: a store is required")
	}
	if cfg.Batch < 1 {
		cfg.Batch = 1000
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Sweeper{cfg: cfg, st: st, log: log, now: now,
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_retention_deleted_total",
			Help: "Rows the retention sweeper deleted, by kind: succeeded, failed, dead, cancelled (jobs), message_dead_letters, tombstones, usage, batches.",
		}, []string{"kind"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_retention_active",
			Help: "1 while this replica is the active retention sweeper.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{s.deleted, s.leader} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("retention: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Run tries to become the active sweeper every Interval and, while it is,
// sweeps every Interval. It returns nil when ctx ends.
func (s *Sweeper) Run(ctx context.Context) error {
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for {
		lease, err := s.st.TryLead(ctx, store.RetentionLockID)
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Warn("retention: try to lead", "error", err)
		case lease != nil:
			s.lead(ctx, lease, tick)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (s *Sweeper) lead(ctx context.Context, lease *store.Lease, tick *time.Ticker) {
	defer lease.Release(context.WithoutCancel(ctx))
	s.leader.Set(1)
	defer s.leader.Set(0)
	for {
		if err := lease.Check(ctx); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("retention: lease lost", "error", err)
			}
			return
		}
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("retention: sweep", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// finished are the statuses a job is deleted in.
var finished = []job.Status{job.StatusSucceeded, job.StatusFailed, job.StatusDead, job.StatusCancelled}

// Counts is what one sweep deleted, by kind (see llmq_retention_deleted_total).
type Counts map[string]int

// Sweep runs one pass at the clock's time: every expired row goes, batch
// by batch. It carries on past a failed step and returns the first error.
func (s *Sweeper) Sweep(ctx context.Context) (Counts, error) {
	now := s.now()
	got := Counts{}
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	tenants, err := s.st.JobTenants(ctx)
	keep(err)
	sort.Strings(tenants)
	for _, tenant := range tenants {
		for _, st := range finished {
			d := s.retentionOf(tenant, st)
			if d <= 0 {
				continue
			}
			cutoff := now.Add(-d)
			keep(s.drain(ctx, got, string(st), func(ctx context.Context) (int, error) {
				return s.st.ExpireJobs(ctx, tenant, st, cutoff, now, s.cfg.Batch)
			}))
		}
	}
	if d := s.cfg.Jobs[job.StatusDead]; d > 0 {
		keep(s.drain(ctx, got, "message_dead_letters", func(ctx context.Context) (int, error) {
			return s.st.ExpireMessageDeadLetters(ctx, now.Add(-d), s.cfg.Batch)
		}))
	}
	if d := s.cfg.Idempotency; d > 0 {
		keep(s.drain(ctx, got, "tombstones", func(ctx context.Context) (int, error) {
			return s.st.ExpireTombstones(ctx, now.Add(-d), s.cfg.Batch)
		}))
	}
	if d := s.cfg.Usage; d > 0 {
		keep(s.drain(ctx, got, "usage", func(ctx context.Context) (int, error) {
			return s.st.ExpireUsage(ctx, now.Add(-d), s.cfg.Batch)
		}))
	}
	if d := s.batchRetention(); d > 0 {
		keep(s.drain(ctx, got, "batches", func(ctx context.Context) (int, error) {
			return s.st.ExpireBatches(ctx, now.Add(-d), s.cfg.Batch)
		}))
	}
	return got, first
}

// batchRetention is how long a done provider batch's record is kept: the
// longest retention of any finished status, for any tenant, so the record
// outlives every job it ran (a member finishes no later than its batch is
// done, unless it was sent online first). Zero, for ever, when some
// finished status is kept for ever.
func (s *Sweeper) batchRetention() time.Duration {
	var longest time.Duration
	for _, st := range finished {
		d := s.cfg.Jobs[st]
		if d <= 0 {
			return 0
		}
		longest = max(longest, d)
	}
	for _, p := range s.cfg.Tenants {
		for _, d := range p {
			longest = max(longest, d)
		}
	}
	return longest
}

// retentionOf is tenant's retention of status st: its override, or the
// global one.
func (s *Sweeper) retentionOf(tenant string, st job.Status) time.Duration {
	if d := s.cfg.Tenants[tenant][st]; d > 0 {
		return d
	}
	return s.cfg.Jobs[st]
}

// drain runs batch until it deletes fewer than a full batch, resting Pause
// between batches.
func (s *Sweeper) drain(ctx context.Context, got Counts, kind string, batch func(context.Context) (int, error)) error {
	for {
		n, err := batch(ctx)
		got[kind] += n
		s.deleted.WithLabelValues(kind).Add(float64(n))
		if err != nil || n < s.cfg.Batch {
			return err
		}
		if s.cfg.Pause > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(s.cfg.Pause):
			}
		}
	}
}
