// Package worker is llmq's consume loop: it takes job messages off the
// broker lanes, claims them in Postgres in batches, queues each claimed job
// to its model's dispatcher (weighted fair over lanes, round robin over
// tenants), admits it through the model's ratecontrol.Governor, calls the
// provider and settles the outcome: the result stored once, a durable
// delayed retry, a fallback to another model after repeated 429s, a
// permanent failure, or the dead-letter queue. It also keeps the leases of
// running jobs alive, hands unfinished work back on shutdown and exports
// Prometheus metrics.
//
// Order per job (docs/design.md#admission-order): claim → estimate tokens → admission on
// every dimension → concurrency slot → pacing → send → settle usage. The
// last four steps are Governor.Acquire and Permit.Settle; a job waiting for
// admission holds no concurrency slot and no other model's resources.
//
// Everything the worker needs from the store, the broker and the provider
// is a small interface declared here, so unit tests run on the in-memory
// broker and fakes while integration tests use the real services.
//
// Deps.Failpoint is TEST-ONLY (failpoint.go): cmd/consumer sets it only
// when LLMQ_FAILPOINT is in its environment, so the fault suite can kill a
// consumer after a provider call or after a result write.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/batch"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
)

// Store is what the worker needs from internal/store.
type Store interface {
	ClaimBatch(ctx context.Context, keys []job.Key, owner string, lease time.Duration) ([]store.Claim, error)
	CompleteBatch(ctx context.Context, items []store.Completion) ([]bool, error)
	Fail(ctx context.Context, a store.Attempt, e store.AttemptError) (bool, error)
	ScheduleRetry(ctx context.Context, a store.Attempt, at time.Time, e store.AttemptError) (bool, error)
	DeferRateLimited(ctx context.Context, a store.Attempt, at time.Time, e store.AttemptError) (bool, error)
	MarkDeadLettered(ctx context.Context, a store.Attempt, e store.AttemptError, dl store.DeadLetterRow) (bool, error)
	MarkUnenqueued(ctx context.Context, key job.Key) error
	Release(ctx context.Context, key job.Key, owner string) (bool, error)
	ReleaseBatch(ctx context.Context, keys []job.Key, owner string) ([]bool, error)
	Heartbeat(ctx context.Context, owner string, keys []job.Key, lease time.Duration) (int, error)
	InsertClaiming(ctx context.Context, jobs []job.Job, cl store.Claiming) ([]store.BatchInsert, error)
	InsertFinished(ctx context.Context, items []store.Finished) ([]bool, error)
	RecordDeadLetter(ctx context.Context, dl store.DeadLetterRow) (int64, error)
	RecordIntakeFailure(ctx context.Context, f store.IntakeFailure) (store.IntakeOutcome, error)
	UnstorableJobs(ctx context.Context, jobs []job.Job) ([]error, error)
	Resubmitted(ctx context.Context, key job.Key) (store.Record, error)
}

// Provider is what the worker needs from internal/provider.
type Provider interface {
	Chat(ctx context.Context, model string, request []byte) (*provider.Response, error)
}

var (
	_ Store    = (*store.Store)(nil)
	_ Provider = (*provider.Client)(nil)
	_ Provider = (*provider.Router)(nil)
)

// Config tunes a Worker. Build it from config.Config with FromConfig.
type Config struct {
	// Owner names this replica in leases.
	Owner string
	// Lease is how long a claim lives without a heartbeat (default 60s).
	Lease time.Duration
	// Prefetch is the broker prefetch per lane (default 64).
	Prefetch int
	// Weights of the high, normal and low lanes (default 6:3:1).
	WeightHigh, WeightNormal, WeightLow int
	// FallbackAfter429 is how many 429s on one model move a job down its
	// fallback chain (default 2).
	FallbackAfter429 int
	// RetryBase and RetryMax bound backoff (default 1s, 5m).
	RetryBase, RetryMax time.Duration
	// ShutdownGrace is how long in-flight calls may finish after shutdown
	// starts (default 30s).
	ShutdownGrace time.Duration
	// MaxInFlight caps the deliveries held at once (default
	// config.DefaultMaxInFlight).
	MaxInFlight int
	// Limits bound a job message (payload size, max_tokens).
	Limits job.Limits
	// Models are the configured models; when non-empty a job for another
	// model is dead-lettered as malformed. Fallback and Capabilities are read
	// from here.
	Models map[string]config.Model
	// ClaimBatch is the most deliveries claimed in one round trip (default 128).
	ClaimBatch int
	// BatchWait is how long a batch waits for more deliveries (default 1ms).
	BatchWait time.Duration
	// TenantHold is how many jobs of one tenant, model and lane wait for
	// admission in this replica before further ones are parked (tenants.go;
	// default Prefetch/4; negative turns parking off).
	TenantHold int
	// Tenants are the tenants' weights, caps and budgets.
	Tenants map[string]config.TenantLimits
	// RateLimitAttemptFactor bounds a job that keeps being rate limited:
	// rate-limited attempts do not use up max_attempts (the store gives them
	// back), but after factor × max_attempts of them the job is dead
	// (default 4).
	RateLimitAttemptFactor int
	// LanesOnly turns the direct intake off (direct.go): every job the
	// ingester of this process stores goes through a lane.
	LanesOnly bool
	// StoreDelay is how long a job taken directly may run before its row
	// is written (writeonce.go; default 200ms, negative: written at once).
	StoreDelay time.Duration
	// TaskPollInterval is how often a task job's task is polled (default
	// 1s) until its model's task times are known; then the longest wait
	// between polls (task_schedule.go).
	TaskPollInterval time.Duration
	// MetricTenants get their own label in the per-tenant metrics; other tenants count as "other" (tenantmetrics.go).
	MetricTenants []string
}

// FromConfig takes the worker settings out of llmq's configuration.
func FromConfig(c config.Config) Config {
	return Config{
		Owner: c.Worker.ID, Lease: c.Worker.Lease, Prefetch: c.Worker.Prefetch,
		WeightHigh: c.Worker.WeightHigh, WeightNormal: c.Worker.WeightNormal, WeightLow: c.Worker.WeightLow,
		FallbackAfter429: c.Worker.FallbackAfter429, RetryBase: c.Worker.RetryBase, RetryMax: c.Worker.RetryMax,
		ShutdownGrace: c.Worker.ShutdownGrace, MaxInFlight: c.Worker.MaxInFlight,
		Limits: c.Limits.Job(),
		Models: c.Models, TenantHold: c.Worker.TenantHold, TaskPollInterval: c.Worker.TaskPollInterval, LanesOnly: c.Worker.LanesOnly, StoreDelay: c.Worker.StoreDelay, Tenants: tenantLimitsOf(c), MetricTenants: MetricTenants(c),
	}
}

func tenantLimitsOf(c config.Config) map[string]config.TenantLimits {
	out := make(map[string]config.TenantLimits, len(c.Tenants))
	for name, t := range c.Tenants {
		out[name] = t.TenantLimits
	}
	return out
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	d := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	dd := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	if c.Owner == "" {
		c.Owner = fmt.Sprintf("worker-%d", rand.Int64())
	}
	dd(&c.Lease, 60*time.Second)
	d(&c.Prefetch, 64)
	d(&c.WeightHigh, 6)
	d(&c.WeightNormal, 3)
	d(&c.WeightLow, 1)
	d(&c.FallbackAfter429, 2)
	dd(&c.RetryBase, time.Second)
	dd(&c.RetryMax, 5*time.Minute)
	dd(&c.ShutdownGrace, 30*time.Second)
	d(&c.MaxInFlight, config.DefaultMaxInFlight)
	d(&c.ClaimBatch, 128)
	if c.TenantHold == 0 {
		c.TenantHold = max(c.Prefetch/4, 1)
	}
	dd(&c.BatchWait, time.Millisecond)
	if c.StoreDelay == 0 {
		c.StoreDelay = DefaultStoreDelay
	}
	d(&c.RateLimitAttemptFactor, 4)
	dd(&c.TaskPollInterval, time.Second)
	c.Limits = c.Limits.WithDefaults()
	return c
}

// Deps are the worker's collaborators.
type Deps struct {
	Store      Store
	Subscriber broker.Subscriber
	Provider   Provider
	// Governor returns the governor of a model; it is called once per model
	// and the result kept. nil means ratecontrol's "auto" with no limits.
	Governor func(model string) *ratecontrol.Governor
	Logger   *slog.Logger
	// Registerer receives the worker's metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Rand drives backoff jitter (nil: math/rand).
	Rand func() float64
	// OnRateLimited, when set, hears every 429 (quota.Coordinator.Report429
	// shares it with the other replicas).
	OnRateLimited func(model string, c ratecontrol.Classification)
	// Failpoint is a TEST-ONLY hook called at named points of a job's life
	// (see failpoint.go); nil in production.
	Failpoint func(name string)
	// OnFinished, when set, is called after a batch of results is durable
	// (it wakes the result relay of the same process); it must not block.
	OnFinished func()
	// Lanes publishes parked jobs again (tenants.go) and the wake-ups of
	// jobs taken directly from the intake (direct.go); nil turns both off,
	// as does a Store that cannot park for parking.
	Lanes broker.Publisher
	// TenantShare is this replica's fraction of the tenants' caps (its
	// share of the shared quota); nil: all of them.
	TenantShare func() float64
	// TenantUsage returns each tenant's tokens used today (UTC) by every
	// replica, for the daily budgets; nil: only this replica's count.
	TenantUsage func(ctx context.Context) (map[string]int64, error)
	// Tracer traces each attempt (trace.go); nil is tracing off.
	Tracer *telemetry.Tracer
}

// Worker consumes job messages. Create with New, start with Run.
type Worker struct {
	cfg     Config
	store   Store
	sub     broker.Subscriber
	prov    Provider
	govFor  func(string) *ratecontrol.Governor
	log     *slog.Logger
	metrics *metrics
	backoff ratecontrol.Backoff
	on429   func(string, ratecontrol.Classification)
	fail    func(string) // test-only failpoint hook (failpoint.go)
	tracer  *telemetry.Tracer
	onDone  func() // Deps.OnFinished

	mu          sync.Mutex
	dispatchers map[string]*dispatcher
	inflight    map[job.Key]*task
	// unwritten are the rows of jobs taken write-once not written yet
	// (writeonce.go), under unwrittenMu.
	unwrittenMu sync.Mutex
	unwritten   map[job.Key]*unwritten
	// parkedBatches are the parked batches locked and not settled yet
	// (parklock.go), under unwrittenMu.
	parkedBatches map[*parkedBatch]struct{}

	slots   chan struct{} // MaxInFlight semaphore
	calls   sync.WaitGroup
	callers *callers       // the goroutines calls run on (callers.go)
	tasks   sync.WaitGroup // every task until its delivery is settled
	runCtx  context.Context
	hardCtx context.Context // cancelled when the shutdown grace ends
	// callParents are children of hardCtx that calls' contexts hang off,
	// in turn (callContext): one parent for every call in flight made its
	// lock the consumer's most contended (3.3% of its CPU in the
	// side-by-side profile).
	callParents [callParentShards]context.Context
	callTurn    atomic.Uint32
	bg          context.Context // never cancelled: settlement during shutdown

	dispatchWG sync.WaitGroup
	completer  *batch.Batcher[*completion]
	claimer    *batch.Batcher[*task]
	parker     *batch.Batcher[*task] // nil: parking off

	// Fair share across tenants (tenants.go, tenantlimit.go).
	holds   *holds
	parking Parking // the store, when it can park
	// offloading is the store, when it can offload (offload.go).
	offloading Offloading
	lanes      broker.Publisher // publishes unparked jobs
	limits     *tenantLimits
	// taskTimes learns task models' processing times (task_schedule.go).
	taskTimes taskTimes

	// The direct intake (direct.go): direct publishes the wake-ups of its
	// jobs (nil: off); accepting is set while Run takes work (under mu);
	// adopting counts the reservations not yet adopted or given back.
	direct    broker.Publisher
	accepting bool
	adopting  sync.WaitGroup

	finishedAfterStop, handedBack int64
	stopping                      bool
}

// New builds a worker.
func New(cfg Config, deps Deps) (*Worker, error) {
	if deps.Store == nil || deps.Subscriber == nil || deps.Provider == nil {
		return nil, errors.New("worker: Store, Subscriber and Provider are required")
	}
	cfg = cfg.WithDefaults()
	w := &Worker{
		cfg: cfg, store: deps.Store, sub: deps.Subscriber, prov: deps.Provider, tracer: deps.Tracer,
		govFor: deps.Governor, log: deps.Logger, on429: deps.OnRateLimited, fail: deps.Failpoint, onDone: deps.OnFinished,
		dispatchers: map[string]*dispatcher{}, inflight: map[job.Key]*task{}, unwritten: map[job.Key]*unwritten{},
		parkedBatches: map[*parkedBatch]struct{}{},
		slots:         make(chan struct{}, cfg.MaxInFlight),
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	if w.govFor == nil {
		w.govFor = func(string) *ratecontrol.Governor {
			return ratecontrol.NewGovernor(ratecontrol.StrategyAuto, ratecontrol.Limits{})
		}
	}
	w.holds = newHolds(max(cfg.TenantHold, 0))
	w.holds.most = cfg.MaxInFlight
	if p, ok := deps.Store.(Parking); ok && deps.Lanes != nil && cfg.TenantHold > 0 {
		w.parking, w.lanes = p, deps.Lanes
	}
	if !cfg.LanesOnly {
		w.direct = deps.Lanes
	}
	w.offloading, _ = deps.Store.(Offloading)
	w.limits = newTenantLimits(cfg.Tenants, deps.TenantShare, deps.TenantUsage, w.log)
	w.backoff = ratecontrol.Backoff{Base: cfg.RetryBase, Max: cfg.RetryMax, Rand: deps.Rand}
	m, err := newMetrics(deps.Registerer, w)
	if err != nil {
		return nil, err
	}
	w.metrics = m
	return w, nil
}

// Run consumes until ctx ends, then shuts down: it stops taking work,
// lets in-flight calls finish within ShutdownGrace, cancels the rest and
// hands every unfinished job back (store.Release or ReleaseBatch, then
// Nack). It returns nil after a clean shutdown.
func (w *Worker) Run(ctx context.Context) error {
	hardCtx, hardCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hardCancel()
	w.runCtx, w.hardCtx, w.bg = ctx, hardCtx, context.WithoutCancel(ctx)
	for i := range w.callParents {
		var cancel context.CancelFunc
		w.callParents[i], cancel = context.WithCancel(hardCtx)
		defer cancel()
	}

	// The subscriptions outlive ctx until every delivery is settled, so
	// acks of finishing jobs still reach the broker.
	subCtx, subCancel := context.WithCancel(w.bg)
	defer subCancel()
	var chans []<-chan broker.Delivery
	for _, lane := range job.Priorities {
		ch, err := w.sub.Subscribe(subCtx, lane, w.cfg.Prefetch)
		if err != nil {
			return fmt.Errorf("subscribe to lane %s: %w", lane, err)
		}
		chans = append(chans, ch)
	}

	w.callers = newCallers(callerIdle)
	w.completer = batch.New(w.cfg.ClaimBatch, w.cfg.BatchWait, 4, w.flushCompletions)
	w.claimer = batch.New(w.cfg.ClaimBatch, w.cfg.BatchWait, 4, w.claimBatch)
	if w.parking != nil {
		w.parker = batch.New(w.cfg.ClaimBatch, w.cfg.BatchWait, 2, w.parkBatch)
	}

	var bgWG sync.WaitGroup
	writerStop := make(chan struct{})
	if w.direct != nil && w.cfg.StoreDelay > 0 {
		bgWG.Go(func() { w.writeDue(writerStop) })
	}
	hbCtx, hbCancel := context.WithCancel(w.bg)
	bgWG.Add(1)
	go func() { defer bgWG.Done(); w.heartbeat(hbCtx) }()

	if w.parking != nil {
		bgWG.Go(func() { w.unpark(ctx) })
	}
	bgWG.Go(func() { w.limits.refresh(ctx) })

	var intakeWG sync.WaitGroup
	for i, ch := range chans {
		intakeWG.Add(1)
		go func() { defer intakeWG.Done(); w.receive(ctx, job.Priorities[i], ch) }()
	}
	w.mu.Lock()
	w.accepting = true
	w.mu.Unlock()
	w.log.Info("worker started", "owner", w.cfg.Owner, "prefetch", w.cfg.Prefetch, "max_in_flight", w.cfg.MaxInFlight)

	<-ctx.Done()
	w.mu.Lock()
	w.stopping, w.accepting = true, false
	inflightAtStop := len(w.inflight)
	w.mu.Unlock()
	w.log.Info("worker stopping", "in_flight", inflightAtStop, "grace", w.cfg.ShutdownGrace.String())

	intakeWG.Wait()
	w.adopting.Wait() // jobs the ingester reserved room for are adopted or given back
	if w.parker != nil {
		w.parker.Close() // parks in progress finish; what they do not park is claimed
	}
	w.claimer.Close() // claims in progress finish; their jobs are handed back by the stopped dispatchers
	w.dispatchWG.Wait()

	callsDone := make(chan struct{})
	go func() { w.calls.Wait(); close(callsDone) }()
	grace := time.NewTimer(w.cfg.ShutdownGrace)
	select {
	case <-callsDone:
	case <-grace.C:
		w.log.Warn("shutdown grace over: cancelling in-flight calls")
		hardCancel()
		<-callsDone
	}
	grace.Stop()
	w.callers.close()
	w.completer.Close()
	w.tasks.Wait()
	close(writerStop) // every task has ended, and with it its row's wait
	hbCancel()
	bgWG.Wait()
	subCancel()

	w.mu.Lock()
	finished, handed := w.finishedAfterStop, w.handedBack
	w.mu.Unlock()
	w.log.Info("worker stopped", "finished", finished, "handed_back", handed)
	return nil
}

// dispatcherFor returns the model's dispatcher, starting it on first use.
func (w *Worker) dispatcherFor(model string) *dispatcher {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.dispatchers[model]
	if d == nil {
		d = newDispatcher(w, model, w.govFor(model))
		w.dispatchers[model] = d
		w.dispatchWG.Add(1)
		go func() { defer w.dispatchWG.Done(); d.run(w.runCtx) }()
	}
	return d
}

func (w *Worker) track(t *task) {
	w.mu.Lock()
	w.inflight[t.key] = t
	w.mu.Unlock()
}

// GovernorFactory returns Deps.Governor for the configured models: each
// model's strategy and limits; a model not under models: gets the default
// strategy with no limits.
func GovernorFactory(models map[string]config.Model, defaultStrategy string, opts ...ratecontrol.Option) func(string) *ratecontrol.Governor {
	return func(name string) *ratecontrol.Governor {
		m, ok := models[name]
		s := defaultStrategy
		if ok && m.Strategy != "" {
			s = m.Strategy
		}
		strategy, err := ratecontrol.ParseStrategy(s)
		if err != nil {
			strategy = ratecontrol.StrategyAuto
		}
		lim, inputOnly := limitsOf(m)
		o := opts
		if inputOnly {
			// Billed on its input alone: book no expected output.
			o = append(slices.Clip(opts), ratecontrol.WithInputOnly())
		}
		if m.KindOf() == job.KindTask {
			// max_concurrency is the provider's limit of running tasks.
			o = append(slices.Clip(o), ratecontrol.WithFullStart())
		}
		return ratecontrol.NewGovernor(strategy, lim, o...)
	}
}
