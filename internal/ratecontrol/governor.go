package ratecontrol

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/ratecontrol/flow"
)

// Request is what the Governor needs to know of a call before it goes.
type Request struct {
	InputTokens int // llmq's estimate (EstimateTokens)
	MaxTokens   int // the request's max_tokens; 0 = unknown
}

// Result is the outcome of a call, given to Permit.Settle.
type Result struct {
	Class            Classification
	PromptTokens     int // provider usage; both 0 = unknown
	CompletionTokens int
	Latency          time.Duration
	Headers          http.Header // response headers; may be nil
}

// Option configures a Governor.
type Option func(*Governor)

// WithClock sets the clock read by the Governor (default time.Now). Waits
// use the runtime's timers, so tests run the Governor under testing/synctest.
func WithClock(now func() time.Time) Option { return func(g *Governor) { g.now = now } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(g *Governor) { g.log = l } }

// WithController tunes the adaptive controller of adaptive and auto
// (Max and the quotas always come from Limits).
func WithController(cfg flow.ControllerConfig) Option { return func(g *Governor) { g.ctlCfg = cfg } }

// WithFullStart starts the concurrency of adaptive and auto at
// MaxConcurrency instead of probing up to it: for a model whose
// max_concurrency is the provider's own limit of running tasks (task jobs,
// docs/design.md#kinds), there is no capacity to find. A 429 still cuts
// the limit, and probing brings it back.
func WithFullStart() Option { return func(g *Governor) { g.fullStart = true } }

// WithTokenReserve sets auto's statistical token reserve: how many standard
// deviations of the output still unknown (that of the calls in flight, by
// their age) the TPM limit keeps free, unless the worst case is smaller
// (default 5.5; docs/design.md#calibration). It trades TPM utilisation
// for the guarantee that no sliding minute exceeds TPM. The sum of a few
// skewed deviations has a long right tail, hence the many sigmas: with few
// calls a minute and long answers, fewer sigmas let some minutes go over
// (BENCHMARKS.md, "Tuning figures behind auto's constants"). With many
// calls in flight, or outputs of a few fixed lengths, the reserve is a
// small share of TPM.
func WithTokenReserve(sigmas float64) Option { return func(g *Governor) { g.reserve = max(sigmas, 0) } }

// WithInputOnly is for a model whose calls are billed on input tokens only
// (embeddings, docs/design.md#kinds): a call books its input estimate and
// no expected output, and settles from the prompt tokens reported.
func WithInputOnly() Option { return func(g *Governor) { g.cal.SetDefaultOutput(0) } }

// Governor is one model's admission pipeline, in the order of
// docs/design.md#admission-order: estimate → admission on every dimension
// → concurrency slot → pacing → send → settle. It never holds a concurrency
// slot while waiting for tokens. Safe for concurrent use.
type Governor struct {
	strategy Strategy
	now      func() time.Time
	log      *slog.Logger
	ctlCfg   flow.ControllerConfig
	// fullStart: the controller starts at MaxConcurrency (WithFullStart).
	fullStart bool
	cal       *flow.Calibrator
	reserve   float64 // auto's token reserve in deviations

	mu sync.Mutex // serialises SetLimits
	pl atomic.Pointer[pipeline]

	seqMu          sync.Mutex
	seq            atomic.Uint64
	granted        atomic.Uint64
	rateLimited    atomic.Uint64
	tokMu          sync.Mutex
	inflightTokens float64 // tokens booked by permits not yet settled
	bookedTokens   float64 // tokens booked by every permit granted

	wakeMu  sync.Mutex
	resumed chan struct{} // closed by Resume (pause.go)
	// heldUntil is the end of the pause (pause.go); zero when none. Under
	// wakeMu.
	heldUntil time.Time
}

// NewGovernor builds the pipeline of strategy for lim. An unknown strategy
// behaves as auto.
func NewGovernor(strategy Strategy, lim Limits, opts ...Option) *Governor {
	if _, err := ParseStrategy(string(strategy)); err != nil || strategy == "" {
		strategy = StrategyAuto
	}
	g := &Governor{strategy: strategy, now: time.Now, log: slog.New(slog.DiscardHandler), cal: flow.NewCalibrator(),
		reserve: defaultTokenReserve}
	for _, o := range opts {
		o(g)
	}
	g.pl.Store(g.build(g.now(), lim))
	return g
}

// Strategy reports the strategy.
func (g *Governor) Strategy() Strategy { return g.strategy }

// SetLimits changes the limits at runtime (e.g. a new share of a quota
// leased across replicas). Bucket levels, debt, the controller and the
// calibration are kept when only values change; if a rule appears or
// disappears the pipeline is rebuilt (outstanding permits settle into the
// old one, harmlessly).
func (g *Governor) SetLimits(lim Limits) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if !g.retune(now, g.pl.Load(), lim) {
		pl := g.build(now, lim)
		g.rehold(now, pl)
		g.pl.Store(pl)
	}
}

// Limits reports the current limits.
func (g *Governor) Limits() Limits { return g.pl.Load().limits() }

// Acquire blocks until the call may be sent, or ctx ends (then it holds and
// books nothing and returns an error wrapping ctx.Err()).
func (g *Governor) Acquire(ctx context.Context, req Request) (*Permit, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("ratecontrol: acquire: %w", err)
	}
	pl := g.pl.Load()
	p := &Permit{g: g, pl: pl, estimate: req.InputTokens}
	// now is re-read only after a wait: time.Now is not free on every host.
	now, err := g.awaitDrain(ctx, pl, g.now())
	if err != nil {
		return nil, err
	}
	if g.strategy == StrategyAuto {
		return g.acquireAuto(ctx, pl, p, req, now)
	}
	return g.acquireClassic(ctx, pl, p, req, now)
}

// grant counts a permit that may go and the tokens it booked.
func (g *Governor) grant(p *Permit) {
	g.granted.Add(1)
	g.tokMu.Lock()
	g.inflightTokens += p.booked
	g.bookedTokens += p.booked
	g.tokMu.Unlock()
}

// Penalize feeds a 429 seen by another replica sharing the quota: the
// controller drains (one cut per cooldown) and the named bucket empties.
func (g *Governor) Penalize(c Classification) {
	if !c.Kind.RateLimited() {
		return
	}
	pl, now := g.pl.Load(), g.now()
	if pl.adm != nil && g.strategy != StrategyShaping && g.strategy != StrategyRateLimit {
		pl.clampFor(now, c.Kind)
	}
	if pl.ctl != nil {
		pl.ctl.Penalize(now, c.RetryAfter)
		pl.sem.SetLimit(pl.ctl.Limit())
	}
}

// timerFloor is the shortest wait auto sleeps. Go's timers wake up to a
// millisecond late for shorter sleeps on common Linux hosts (1.08 ms for
// a 60 µs sleep, measured in BENCHMARKS.md), so a shorter wait is sent at
// once: at most this early, never more often than the schedule allows.
const timerFloor = time.Millisecond

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
