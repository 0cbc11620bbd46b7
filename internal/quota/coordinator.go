package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ratecontrol"
)

// Governor is what the coordinator needs of one model's admission pipeline;
// *ratecontrol.Governor implements it.
type Governor interface {
	SetLimits(ratecontrol.Limits)
	Penalize(ratecontrol.Classification)
	Pause(time.Duration)
	Resume()
	Snapshot() ratecontrol.Snapshot
}

var _ Governor = (*ratecontrol.Governor)(nil)

// DemandFunc reports what this replica wanted of model over the last
// interval (see Demand). Without one, demand comes from the backlog hint
// and the governor's Snapshot (see the package doc).
type DemandFunc func(model string) Demand

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("quota: coordinator closed")

// Defaults.
const (
	DefaultInterval = time.Second
	DefaultFloor    = 0.05 // of the limit, split among the members
	maxPending      = 256  // unsent penalties kept
	pruneEvery      = 30   // rounds between penalty pruning
	penaltyKeep     = 5 * time.Minute
	// penaltyLate is the least time after its insert began that a penalty
	// is read again whatever its seq (Coordinator.lateWindow).
	penaltyLate = 10 * time.Second
)

// Option configures a Coordinator.
type Option func(*Coordinator)

// WithInterval sets the round interval (default 1s).
func WithInterval(d time.Duration) Option { return func(c *Coordinator) { c.interval = d } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(c *Coordinator) { c.log = l } }

// WithRegisterer registers the coordinator's metrics (default: none).
func WithRegisterer(r prometheus.Registerer) Option { return func(c *Coordinator) { c.reg = r } }

// WithDemand replaces the Snapshot-based demand estimate.
func WithDemand(f DemandFunc) Option { return func(c *Coordinator) { c.demand = f } }

// WithBacklog tells the Snapshot-based demand how many jobs of a model are
// waiting in this replica (queued for admission or inside Acquire). A
// replica with a backlog wants the whole limit, whatever its governor's
// recent rate: a governor sleeping on a wait booked under a smaller share
// looks idle in its Snapshot.
func WithBacklog(f func(model string) int) Option { return func(c *Coordinator) { c.backlog = f } }

// WithFloor sets the idle floor: a replica's weight is at least
// floor × limit / N (default 0.05).
func WithFloor(f float64) Option { return func(c *Coordinator) { c.floor = f } }

// WithClock sets the local clock (default time.Now). It times demand and
// the local estimate of the lease's expiry; leases themselves expire by the
// database's clock, so replicas' clocks need not agree.
func WithClock(now func() time.Time) Option { return func(c *Coordinator) { c.now = now } }

// WithObserver is called after every round (successful or not) from the
// Run goroutine; it must not block. For tests and diagnostics.
func WithObserver(f func(Report)) Option { return func(c *Coordinator) { c.observe = f } }

// Report is the outcome of one round.
type Report struct {
	Replica  string
	At       time.Time // local clock, start of the round
	Duration time.Duration
	Err      error // nil when the round committed
	Fallback bool
	Models   map[string]ModelReport
}

// ModelReport is one model's part of a Report.
type ModelReport struct {
	Members []Member // live members as read, this replica's row with its new share
	Target  Share
	Applied Share
	// Adopted is what the replica's first round took from the others'
	// learned state (nil in later rounds, or when none was offered).
	Adopted *Adoption
}

// Coordinator shares each model's provider quota among the consumer
// replicas that run one, through leases in Postgres (see the package doc).
type Coordinator struct {
	pool     *pgxpool.Pool
	id       string
	models   map[string]config.Model
	names    []string // sorted: the lock order
	govs     map[string]Governor
	cfg      config.Quota
	interval time.Duration
	timeout  time.Duration // of one round: max(interval, lease_ttl/4)
	// lateWindow: penalties whose insert began this long ago are read
	// again whatever their seq (round.go).
	lateWindow time.Duration
	// pauseHold is the drain a paused governor is held in, renewed each round.
	pauseHold time.Duration
	floor     float64
	now       func() time.Time
	log       *slog.Logger
	reg       prometheus.Registerer
	met       *metrics
	demand    DemandFunc
	backlog   func(model string) int
	observe   func(Report)

	mu         sync.Mutex // guards applied, inFallback (read by Shares)
	applied    map[string]Share
	inFallback bool

	// Owned by the Run goroutine.
	lastRenew    time.Time           // local start of the last committed round
	failingSince time.Time           // local start of the current streak of failed rounds
	lastSeq      int64               // last penalty seen; -1 before the first round
	seenPens     map[int64]time.Time // penalties of the late window seen, by seq (penalty.go)
	samples      map[string]sample
	lastBusy     map[string]time.Time // per model: when its governor last looked busy
	rounds       int
	wrote        map[string]learnedMark // per model: the learned state last written

	pmu     sync.Mutex
	pending []penalty
	notify  chan struct{}

	runMu     sync.Mutex
	runDone   chan struct{}
	closing   chan struct{}
	closeOnce sync.Once
	ready     chan struct{}
	readyOnce sync.Once
}

// New returns a coordinator for replicaID over models, whose governors gov
// returns. It sets every governor to share 0 at once: shares arrive with
// the first rounds of Run, and the caller should start sending only after
// Ready (see the package doc). cfg.LeaseTTL must be several intervals.
func New(pool *pgxpool.Pool, replicaID string, models map[string]config.Model, gov func(model string) Governor, cfg config.Quota, opts ...Option) *Coordinator {
	c := &Coordinator{
		pool: pool, id: replicaID, models: maps.Clone(models), cfg: cfg,
		names:    slices.Sorted(maps.Keys(models)),
		govs:     make(map[string]Governor, len(models)),
		interval: DefaultInterval, floor: DefaultFloor, now: time.Now,
		log:     slog.New(slog.DiscardHandler),
		applied: make(map[string]Share, len(models)),
		lastSeq: -1, seenPens: make(map[int64]time.Time), samples: make(map[string]sample), lastBusy: make(map[string]time.Time), wrote: make(map[string]learnedMark),
		notify:  make(chan struct{}, 1),
		closing: make(chan struct{}), ready: make(chan struct{}),
	}
	for _, o := range opts {
		o(c)
	}
	if c.cfg.LeaseTTL <= 0 {
		c.cfg.LeaseTTL = 10 * time.Second
	}
	c.timeout = max(c.interval, c.cfg.LeaseTTL/4)
	c.pauseHold = c.interval + c.timeout
	// A bigserial is taken before the commit, so a penalty can become
	// visible after one with a higher seq that a round already read: up
	// to the insert's timeout after it began, read by the next round,
	// which a round in progress and the insert itself (both on the Run
	// goroutine, each up to a timeout) may hold back.
	c.lateWindow = max(penaltyLate, 3*c.timeout+2*c.interval)
	c.met = newMetrics(c.reg)
	for _, name := range c.names {
		c.govs[name] = gov(name)
		c.setLimits(name, Share{})
	}
	return c
}

// Ready is closed once every model has a positive share (from Postgres or
// the fallback share). Start the consumer's work after it.
func (c *Coordinator) Ready() <-chan struct{} { return c.ready }

// Shares returns the share each model has applied.
func (c *Coordinator) Shares() map[string]Share {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.applied)
}

// Fallback reports whether the last round failed and fallback shares apply.
func (c *Coordinator) Fallback() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inFallback
}

// Run coordinates every interval until ctx ends or Close is called; it
// returns nil then. Ending ctx without Close leaves the lease to expire
// (as a crash would); Close hands it back at once.
func (c *Coordinator) Run(ctx context.Context) error {
	c.runMu.Lock()
	select {
	case <-c.closing:
		c.runMu.Unlock()
		return ErrClosed
	default:
	}
	if c.runDone != nil {
		c.runMu.Unlock()
		return errors.New("quota: Run called twice")
	}
	done := make(chan struct{})
	c.runDone = done
	c.runMu.Unlock()
	defer close(done)

	t := time.NewTicker(c.interval)
	defer t.Stop()
	c.tick(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.closing:
			return nil
		case <-t.C:
			c.tick(ctx)
		case <-c.notify:
			c.flushPenalties(ctx)
		}
	}
}

// Close stops Run (waiting for it), pauses every governor and hands the
// leases back, so the other replicas absorb this one's share in their next
// round. Call it once the replica stops sending.
func (c *Coordinator) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { close(c.closing) })
	c.runMu.Lock()
	done := c.runDone
	c.runMu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("quota: close: wait for run: %w", ctx.Err())
		}
	}
	for _, name := range c.names {
		c.setLimits(name, Share{})
	}
	if _, err := c.pool.Exec(ctx, `DELETE FROM quota_members WHERE replica_id = $1 AND model = ANY($2)`, c.id, c.names); err != nil {
		return fmt.Errorf("quota: hand back leases of %s: %w", c.id, err)
	}
	c.log.Info("quota leases handed back", "replica_id", c.id, "models", len(c.names))
	return nil
}

// tick runs one round and falls back when it fails.
func (c *Coordinator) tick(ctx context.Context) Report {
	start := c.now()
	rep, err := c.round(ctx, start)
	rep.Replica, rep.At = c.id, start
	rep.Duration = c.now().Sub(start)
	if err != nil {
		if ctx.Err() != nil {
			rep.Err = err
			return rep // stopping: not a Postgres failure
		}
		rep.Err = err
		c.fallBack(start, err)
		rep.Fallback = true
	} else {
		c.failingSince = time.Time{}
		c.met.renewals.Inc()
		c.met.round.Observe(rep.Duration.Seconds())
		c.mu.Lock()
		was := c.inFallback
		c.inFallback = false
		c.mu.Unlock()
		if was {
			c.met.fallback.Set(0)
			c.log.Info("quota coordination recovered", "replica_id", c.id)
		}
	}
	c.mu.Lock()
	var held []string
	for _, name := range c.names {
		if paused(c.applied[name]) {
			held = append(held, name)
		}
	}
	c.mu.Unlock()
	for _, name := range held {
		c.holdPaused(name)
	}
	c.checkReady()
	if c.observe != nil {
		c.observe(rep)
	}
	return rep
}

// fallBack applies the conservative local share after a failed round.
// Until a whole lease_ttl has passed since the last committed round (or,
// for a replica that never committed one, since its failures began), its
// lease may still be live and counted by the others, or Postgres may only
// be slow: it keeps min(applied, fallback). After that the others have
// absorbed its lease, and it runs on fallback_share × limit alone (0 =
// fail closed). The transition is logged once.
func (c *Coordinator) fallBack(now time.Time, err error) {
	if c.failingSince.IsZero() {
		c.failingSince = now
	}
	since := c.lastRenew
	if since.IsZero() {
		since = c.failingSince
	}
	leaseLive := now.Sub(since) < c.cfg.LeaseTTL
	f := c.cfg.FallbackShare
	for _, name := range c.names {
		c.mu.Lock()
		cur := c.applied[name]
		c.mu.Unlock()
		s := Share{Requests: f, Tokens: f}
		if leaseLive {
			s = Share{Requests: min(cur.Requests, f), Tokens: min(cur.Tokens, f)}
		}
		if s != cur {
			c.setLimits(name, s)
		}
	}
	c.mu.Lock()
	was := c.inFallback
	c.inFallback = true
	c.mu.Unlock()
	if !was {
		c.met.fallback.Set(1)
		c.log.Warn("quota coordination failed: using the fallback share until Postgres answers",
			"replica_id", c.id, "fallback_share", f, "lease_live", leaseLive, "error", err)
	}
}

// setLimits applies share s of model to its governor and records it.
func (c *Coordinator) setLimits(model string, s Share) {
	m := c.models[model]
	// Paused before the limits of nothing apply, resumed after the new
	// ones do: a caller in between books under neither.
	if paused(s) {
		c.holdPaused(model)
	}
	c.govs[model].SetLimits(Limits(m, s))
	if !paused(s) {
		c.govs[model].Resume()
	}
	c.mu.Lock()
	c.applied[model] = s
	c.mu.Unlock()
	c.met.setShare(model, m, s)
}

// paused reports a share that admits nothing.
func paused(s Share) bool { return s.Requests <= 0 || s.Tokens <= 0 }

// holdPaused pauses a governor for a little longer than a round.
// ratecontrol plans an admission's wait once, from the limits in force when
// it books it, so a call booked under the tiny quota of a paused share
// would wait for ages even after the share grows; a pause, in contrast,
// holds callers before they book. Every round renews it while the share
// stays 0; the round that makes the share positive resumes the governor
// (setLimits), so a new replica sends from its first round on instead of
// waiting out pauseHold. (Strategies without a controller — ratelimit,
// shaping — get no pause: start their work after Ready.)
func (c *Coordinator) holdPaused(model string) {
	c.govs[model].Pause(c.pauseHold)
}

func (c *Coordinator) checkReady() {
	c.mu.Lock()
	ok := true
	for _, name := range c.names {
		if s := c.applied[name]; s.Requests <= 0 || s.Tokens <= 0 {
			ok = false
		}
	}
	c.mu.Unlock()
	if ok {
		c.readyOnce.Do(func() { close(c.ready) })
	}
}
