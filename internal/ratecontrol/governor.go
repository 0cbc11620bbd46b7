package ratecontrol

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
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
func WithController(cfg ControllerConfig) Option { return func(g *Governor) { g.ctlCfg = cfg } }

// WithTokenReserve sets auto's statistical token reserve: how many standard
// deviations of the output still unknown (that of the calls in flight, by
// their age) the TPM limit keeps free, unless the worst case is smaller
// (default DefaultTokenReserve = 5.5). It trades TPM utilisation for the
// guarantee that no sliding minute exceeds TPM. On TestTPMWithSettlement's
// workload (~50 calls a minute, 30% of them 16–40 s answers, TPM 90k; 32
// seeds; share of 10 minutes' TPM used, including a 30 s warm-up): 5.5 →
// no minute over in 160 seed runs (worst 96.4–98.8%), 84–86% used; while
// tuning, 4.5 put 1 seed run in 64 at 101%, and 3 put 3–6 seeds of 32 over.
// The sum of a few skewed deviations has a long right tail, hence the
// many sigmas; with many calls in flight, or outputs of a few fixed
// lengths, the reserve is a small share of TPM (1.3–1.7% in llmq bench's
// mixed scenario, where the worst case binds).
func WithTokenReserve(sigmas float64) Option { return func(g *Governor) { g.reserve = max(sigmas, 0) } }

// Governor is one model's admission pipeline, in the seed's order:
// estimate → admission on every dimension → concurrency slot → pacing →
// send → settle. It never holds a concurrency slot while waiting for
// tokens. Safe for concurrent use.
type Governor struct {
	strategy Strategy
	now      func() time.Time
	log      *slog.Logger
	ctlCfg   ControllerConfig
	cal      *Calibrator
	reserve  float64 // auto's token reserve in deviations

	mu sync.Mutex // serialises SetLimits
	pl atomic.Pointer[pipeline]

	seqMu          sync.Mutex
	seq            atomic.Uint64
	granted        atomic.Uint64
	rateLimited    atomic.Uint64
	tokMu          sync.Mutex
	inflightTokens float64 // tokens booked by permits not yet settled
}

// NewGovernor builds the pipeline of strategy for lim. An unknown strategy
// behaves as auto.
func NewGovernor(strategy Strategy, lim Limits, opts ...Option) *Governor {
	if _, err := ParseStrategy(string(strategy)); err != nil || strategy == "" {
		strategy = StrategyAuto
	}
	g := &Governor{strategy: strategy, now: time.Now, log: slog.New(slog.DiscardHandler), cal: NewCalibrator(),
		reserve: DefaultTokenReserve}
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
		g.pl.Store(g.build(now, lim))
	}
}

// Limits reports the current limits.
func (g *Governor) Limits() Limits { return g.pl.Load().limits() }

// Permit is the right to send one call. Settle or Cancel it exactly once;
// later calls are no-ops.
type Permit struct {
	g        *Governor
	pl       *pipeline
	res      Reservation
	slot     bool
	seq      uint64
	estimate int
	booked   float64 // tokens booked
	sentAt   time.Time
	done     atomic.Bool

	// auto's aging (aging.go): output booked, the request's max_tokens,
	// tokens charged since the grant, where the tokens are in res.Cost;
	// extra, res and ageIdx are guarded by the pipeline's ageMu while tracked.
	outBooked float64
	unknown   unknown // of its output (aging)
	maxOut    float64
	extra     float64
	tokIdx    int
	ageIdx    int
	tracked   bool
}

// Seq is the order in which the permit entered admission (FIFO order).
func (p *Permit) Seq() uint64 { return p.seq }

// SentAt is when the permit was granted.
func (p *Permit) SentAt() time.Time { return p.sentAt }

// BookedTokens is the token cost pre-deducted for the call.
func (p *Permit) BookedTokens() float64 { return p.booked }

// Acquire blocks until the call may be sent, or ctx ends (then it holds and
// books nothing and returns an error wrapping ctx.Err()).
func (g *Governor) Acquire(ctx context.Context, req Request) (*Permit, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("ratecontrol: acquire: %w", err)
	}
	pl := g.pl.Load()
	p := &Permit{g: g, pl: pl, estimate: req.InputTokens}
	// now is re-read only after a wait: time.Now is not free on every host.
	now := g.now()
	if pl.ctl != nil { // DRAIN pauses admissions; SSR happens here too
		for w := pl.ctl.Admit(now); w > 0; w = pl.ctl.Admit(now) {
			if err := sleepCtx(ctx, w); err != nil {
				return nil, fmt.Errorf("ratecontrol: wait for drain cooldown: %w", err)
			}
			now = g.now()
		}
	}
	if g.strategy == StrategyAuto {
		return g.acquireAuto(ctx, pl, p, req, now)
	}
	refund := func() {
		if pl.adm != nil {
			pl.adm.Refund(g.now(), p.res)
		}
	}
	if pl.gate != nil {
		waited, err := pl.gate.AcquireFunc(ctx, nil)
		if err != nil {
			return nil, fmt.Errorf("ratecontrol: wait for admission turn: %w", err)
		}
		if waited {
			now = g.now()
		}
	}
	if pl.adm != nil {
		if pl.gate == nil {
			g.seqMu.Lock() // seq and reservation in one order
		}
		p.seq = g.seq.Add(1)
		cost := g.cost(req)
		p.booked = cost.Get(DimTokens)
		p.res = pl.adm.Reserve(now, cost)
		if pl.gate == nil {
			g.seqMu.Unlock()
		}
		err := sleepCtx(ctx, p.res.Wait)
		if pl.gate != nil {
			pl.gate.Release()
		}
		if err != nil {
			refund()
			return nil, fmt.Errorf("ratecontrol: wait for admission: %w", err)
		}
		if p.res.Wait > 0 {
			now = g.now()
		}
	} else {
		p.seq = g.seq.Add(1)
	}
	// Concurrency slot, then pacing inside it as the seed does. The pacer is
	// booked at the moment the slot is granted, under the limiter's lock, so
	// sends keep the admission order.
	var pw time.Duration
	pt := now
	paced := false
	bookPacer := func(waited bool) {
		if pl.pacer != nil {
			if waited {
				pt = g.now()
			}
			pw = pl.pacer.Reserve(pt)
			paced = true
		}
	}
	unpace := func() {
		if paced {
			pl.pacer.Cancel()
		}
	}
	if pl.sem != nil {
		if _, err := pl.sem.AcquireFunc(ctx, bookPacer); err != nil {
			unpace()
			refund()
			return nil, fmt.Errorf("ratecontrol: wait for concurrency slot: %w", err)
		}
		p.slot = true
	} else {
		bookPacer(false)
	}
	if err := sleepCtx(ctx, pw); err != nil {
		unpace()
		if p.slot {
			pl.sem.Release()
		}
		refund()
		return nil, fmt.Errorf("ratecontrol: wait for pacer: %w", err)
	}
	p.sentAt = pt.Add(pw)
	g.grant(p)
	return p, nil
}

// ageInFlight re-prices auto's calls in flight (pipeline.age), counts what
// that charged as booked, and returns the tokens booked by calls in flight.
func (g *Governor) ageInFlight(pl *pipeline, now time.Time) float64 {
	aged := pl.age(now, g.cal)
	g.tokMu.Lock()
	defer g.tokMu.Unlock()
	g.inflightTokens += aged
	return g.inflightTokens
}

func (g *Governor) grant(p *Permit) {
	g.granted.Add(1)
	g.tokMu.Lock()
	g.inflightTokens += p.booked
	g.tokMu.Unlock()
}

// acquireAuto is auto's admission. One caller at a time (the gate) takes a
// concurrency slot, books its pacer gap, and books its tokens at the send
// time the pacer gives, then waits for the later of the two; the next
// caller starts when this one is sent. So every booking is made at the
// moment its call goes out, which is where the provider counts it: a
// booking made before a wait for a slot or for the pacer would count the
// call in a minute that does not hold it. The price: the one caller at the
// head holds its slot while it waits for tokens.
func (g *Governor) acquireAuto(ctx context.Context, pl *pipeline, p *Permit, req Request, now time.Time) (*Permit, error) {
	waited, err := pl.gate.AcquireFunc(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("ratecontrol: wait for admission turn: %w", err)
	}
	defer pl.gate.Release()
	if pl.sem != nil {
		w, err := pl.sem.AcquireFunc(ctx, nil)
		if err != nil {
			return nil, fmt.Errorf("ratecontrol: wait for concurrency slot: %w", err)
		}
		p.slot = true
		waited = waited || w
	}
	if waited {
		now = g.now()
	}
	p.seq = g.seq.Add(1)
	var cost Cost
	var rate float64 // tokens per second the pacer spaces sends at
	if pl.adm != nil {
		in, out, dev, scale := g.cal.booking(req.InputTokens, req.MaxTokens)
		p.booked = in + out
		cost = Cost{{DimRequests, 1}, {DimTokens, p.booked}}
		p.outBooked, p.maxOut = out, float64(req.MaxTokens)
		inflight := g.ageInFlight(pl, now)
		total, own, ok := pl.inflightUnknown(out, p.maxOut)
		p.unknown = own
		rate = pl.noteCost(now, p.booked, reserveInput{sigmas: g.reserve, scale: scale,
			unknown: total, ok: ok, inflight: inflight, outDev: dev})
	}
	if pl.freed != nil {
		// from here on settlements wake this caller: one that lands
		// between its booking and its wait counts too (a wake-up left
		// over from an earlier caller costs one needless look)
		pl.waiting.Store(true)
	}
	var pw, spacing, full time.Duration
	if pl.pacer != nil {
		if r := rate; r > 0 {
			// token-aware: a send is followed by a gap its tokens fill at the
			// token rate, so sends spread out evenly; aging and settlement
			// shift the pacer as they shift the token log (pl.repace), so
			// the gaps follow the tokens calls use, not what they booked.
			// (A pacer 5% faster than the rate filled the log early and
			// echoed the warm-up's slow first seconds as a dip a minute
			// later: no more goodput, less smooth.)
			spacing = time.Duration(p.booked / r * float64(time.Second))
		}
		full = max(pl.pacer.Interval(), spacing)
		var strict time.Duration
		if cut := pl.rcap.Spacing(now, full); cut > full {
			// after unforeseen 429s the rate cap's gaps are strict: no
			// making up for lost time until the cap has lifted
			strict, spacing = cut, 0
		}
		pw = pl.pacer.ReserveGaps(now, strict, spacing)
	}
	wait := pw
	if pl.adm != nil {
		p.res = pl.adm.ReserveAt(now, now.Add(pw), cost)
		wait = p.res.Wait
	}
	if pl.freed != nil && wait > 0 {
		wait, err = g.awaitRoom(ctx, pl, p, now, wait)
	} else {
		if pl.freed != nil {
			pl.waiting.Store(false)
		}
		err = sleepCtx(ctx, wait)
	}
	if err != nil {
		if pl.pacer != nil {
			pl.pacer.Cancel()
		}
		if pl.adm != nil {
			pl.adm.Refund(g.now(), p.res)
		}
		if p.slot {
			pl.sem.Release()
		}
		return nil, fmt.Errorf("ratecontrol: wait for admission: %w", err)
	}
	p.sentAt = now.Add(wait)
	if pl.rcap != nil {
		pl.rcap.Sent(p.sentAt, full)
	}
	g.grant(p)
	if pl.adm != nil {
		pl.track(p)
	}
	return p, nil
}

// awaitRoom is the wait of auto's head caller, for its pacer gap and for
// room in the token log. Both were booked from what the calls in flight
// were charged, and answers shorter than booked free room and pull the
// pacer's token schedule earlier before the wait is over: each settlement
// wakes the caller to age the calls in flight and move its send as early as
// it now fits. Without this the log and the pacer stay below their rate for
// the rest of every such wait. It returns the wait from now.
func (g *Governor) awaitRoom(ctx context.Context, pl *pipeline, p *Permit, now time.Time, wait time.Duration) (time.Duration, error) {
	defer pl.waiting.Store(false) // set by acquireAuto before it booked
	deadline := now.Add(wait)
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return wait, ctx.Err()
		case <-t.C:
			return deadline.Sub(now), nil
		case <-pl.freed:
			at := g.now()
			g.ageInFlight(pl, at)
			next := at
			if pl.pacer != nil {
				next = pl.pacer.Recheck(at)
			}
			next = at.Add(pl.adm.Recheck(at, next, p.res))
			if next.Before(deadline) {
				deadline = next
				t.Reset(max(next.Sub(at), 0))
			}
		}
	}
}

// cost is the pre-deduction of one call per strategy (auto's is made in
// acquireAuto).
func (g *Governor) cost(req Request) Cost {
	switch g.strategy {
	case StrategyRateLimit:
		return Cost{{DimRequests, 1}}
	case StrategyShaping: // seed: input tokens only, as estimated
		return Cost{{DimRequests, 1}, {DimTokens, float64(req.InputTokens)}}
	}
	// adaptive: calibrated input + expected output (auto books the same
	// from Calibrator.booking, under one lock, in acquireAuto).
	return Cost{{DimRequests, 1}, {DimTokens, g.cal.Input(req.InputTokens) + g.cal.Output(req.MaxTokens)}}
}

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

// Cancel is for a call that never went out: the slot is released and every
// booking refunded.
func (p *Permit) Cancel() {
	if p == nil || !p.done.CompareAndSwap(false, true) {
		return
	}
	now := p.g.now()
	p.pl.untrack(p)
	p.release()
	if p.pl.adm != nil {
		p.pl.adm.Refund(now, p.res)
	}
	p.pl.wake()
}

func (p *Permit) release() int {
	g := p.g
	g.tokMu.Lock()
	g.inflightTokens -= p.booked + p.extra
	g.tokMu.Unlock()
	if !p.slot {
		return 0
	}
	n := p.pl.sem.InFlight()
	p.pl.sem.Release()
	return n
}

// Settle ends the call: it releases the slot, settles the tokens booked
// against the provider's usage, feeds the calibrator and the controller,
// and corrects bucket levels from rate-limit headers.
func (p *Permit) Settle(res Result) {
	if p == nil || !p.done.CompareAndSwap(false, true) {
		return
	}
	g, pl, now := p.g, p.pl, p.g.now()
	pl.untrack(p)
	inflight := p.release()
	kind := res.Class.Kind
	usage := res.PromptTokens+res.CompletionTokens > 0
	actual := float64(res.PromptTokens + res.CompletionTokens)
	switch {
	case kind.RateLimited():
		g.rateLimited.Add(1)
		// A token 429 that came while auto's log held the minute near TPM
		// was foreseen: what the log could not know (output still unknown,
		// the provider counting a few ms after the send) tipped a full
		// minute over. The clamp corrects the log; cutting the send rate,
		// as for a limit the provider lowered, would idle the next seconds.
		foreseen := kind == KindRateLimitTokens && pl.tokensNearFull(now, p.sentAt)
		if pl.adm != nil && g.strategy != StrategyShaping {
			// A rejected call used no tokens; the request stays booked.
			pl.adm.Settle(now, p.res, Cost{{DimTokens, 0}})
			g.clampFor(now, pl, kind)
		}
		if pl.rcap != nil && !foreseen {
			pl.rcap.OnRateLimit(now, p.sentAt)
		}
		if pl.ctl != nil {
			pl.ctl.OnRateLimit(now, p.sentAt, res.Class.RetryAfter)
			g.log.Info("rate limited: draining", "kind", kind.String(), "code", res.Class.Code,
				"concurrency_limit", pl.ctl.Limit(), "retry_after", res.Class.RetryAfter)
		}
	case usage && pl.adm != nil && g.strategy == StrategyShaping:
		pl.adm.Adjust(now, DimTokens, -float64(res.CompletionTokens)) // seed: settle output only
	case !usage && pl.adm != nil && g.strategy == StrategyAuto && (kind == KindServer || kind == KindClient):
		// An error answer generated no output: keep the input booked (a
		// provider may count it) and give back the rest.
		in := p.booked - p.outBooked
		pl.repace(now, in-p.res.Cost.Get(DimTokens))
		pl.adm.Settle(now, p.res, Cost{{DimTokens, in}})
	case usage && pl.adm != nil:
		if g.strategy == StrategyAuto {
			pl.repace(now, actual-p.res.Cost.Get(DimTokens))
		}
		pl.adm.Settle(now, p.res, Cost{{DimTokens, actual}})
	}
	if kind == KindOK && usage {
		g.cal.Observe(p.estimate, p.booked, res.PromptTokens, res.CompletionTokens, res.Latency)
		if pl.ctl != nil {
			pl.ctl.OnSuccess(now, res.Latency, res.CompletionTokens, res.PromptTokens+res.CompletionTokens, inflight)
		}
	}
	if g.strategy == StrategyAuto && res.Headers != nil && pl.adm != nil {
		g.correct(now, p.sentAt, pl, ParseRateLimitHeaders(res.Headers, now))
	}
	if pl.ctl != nil {
		pl.sem.SetLimit(pl.ctl.Limit())
	}
	pl.wake()
}

// correct lowers bucket levels to what the provider says remains, less the
// tokens booked by calls still in flight: the provider may not have counted
// them yet, or (counting at admission) knows their output before llmq does,
// and either way settlement will bring them in. auto's token log compares
// the figure with the minute of the call it answered for, since providers
// report their count when they admit a call; a bucket can only take it as
// of now.
func (g *Governor) correct(now, sentAt time.Time, pl *pipeline, info RateLimitInfo) {
	if info.HasRequests() {
		pl.adm.Clamp(now, DimRequests, info.RemainingRequests)
	}
	if !info.HasTokens() {
		return
	}
	g.tokMu.Lock()
	inflight := g.inflightTokens
	g.tokMu.Unlock()
	if pl.tokLog != nil {
		pl.marginMu.Lock()
		margin := pl.margin
		pl.marginMu.Unlock()
		pl.tokLog.ClampAt(now, sentAt, info.RemainingTokens-margin+inflight)
		return
	}
	pl.adm.Clamp(now, DimTokens, info.RemainingTokens-inflight)
}

// clampFor empties the bucket of the dimension a 429 names.
func (g *Governor) clampFor(now time.Time, pl *pipeline, k Kind) {
	switch k {
	case KindRateLimitRequests:
		pl.adm.Clamp(now, DimRequests, 0)
	case KindRateLimitTokens:
		pl.adm.Clamp(now, DimTokens, 0)
	}
}

// Penalize feeds a 429 seen by another replica sharing the quota: the
// controller drains (one cut per cooldown) and the named bucket empties.
func (g *Governor) Penalize(c Classification) {
	if !c.Kind.RateLimited() {
		return
	}
	pl, now := g.pl.Load(), g.now()
	if pl.adm != nil && g.strategy != StrategyShaping && g.strategy != StrategyRateLimit {
		g.clampFor(now, pl, c.Kind)
	}
	if pl.ctl != nil {
		pl.ctl.Penalize(now, c.RetryAfter)
		pl.sem.SetLimit(pl.ctl.Limit())
	}
}

// Snapshot is a Governor's state for metrics.
type Snapshot struct {
	Strategy         Strategy
	Limits           Limits
	ConcurrencyLimit int // 0 = unlimited
	InFlight         int
	Waiting          int                 // callers queued for a concurrency slot
	Controller       *ControllerSnapshot // nil without a controller
	Levels           map[string]float64  // bucket level per dimension (lowest of its rules)
	PacerInterval    time.Duration
	Calibration      CalibrationSnapshot // input ratio, output length, estimate error
	InFlightTokens   float64
	TokenMargin      float64 // auto: tokens of TPM held back (burst, largest cost, reserve)
	Granted          uint64
	RateLimited      uint64
}

// Snapshot returns the current state.
func (g *Governor) Snapshot() Snapshot {
	pl, now := g.pl.Load(), g.now()
	s := Snapshot{Strategy: g.strategy, Limits: pl.limits(), Calibration: g.cal.Snapshot(),
		Granted: g.granted.Load(), RateLimited: g.rateLimited.Load()}
	if pl.sem != nil {
		s.ConcurrencyLimit, s.InFlight, s.Waiting = pl.sem.Limit(), pl.sem.InFlight(), pl.sem.Waiting()
	}
	if pl.ctl != nil {
		cs := pl.ctl.Snapshot()
		s.Controller = &cs
	}
	if pl.adm != nil {
		s.Levels = pl.adm.Levels(now)
	}
	if pl.pacer != nil {
		s.PacerInterval = pl.pacer.Interval()
	}
	if g.strategy == StrategyAuto && pl.tokMin != nil {
		pl.marginMu.Lock()
		s.TokenMargin = pl.margin
		pl.marginMu.Unlock()
	}
	g.tokMu.Lock()
	s.InFlightTokens = g.inflightTokens
	g.tokMu.Unlock()
	return s
}
