package ratecontrol

import (
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/ratecontrol/flow"
)

// Permit is the right to send one call. Settle or Cancel it exactly once;
// later calls are no-ops.
type Permit struct {
	g        *Governor
	pl       *pipeline
	res      flow.Reservation
	slot     bool
	seq      uint64
	estimate int
	booked   float64 // tokens booked
	sentAt   time.Time
	// paced is the share of the configured rate's time the send used
	// (auto's rate cap counts it as sent, and takes it back on a 429).
	paced time.Duration
	done  atomic.Bool

	// auto's aging (aging.go): output booked, what the output may still
	// add to the charge, the request's max_tokens, tokens charged since the
	// grant, where the tokens are in res.Cost; extra, res and ageIdx are
	// guarded by the pipeline's ageMu while tracked.
	outBooked float64
	uncharged unchargedOutput
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

// release gives back the permit's concurrency slot and its share of the
// tokens in flight, and returns the calls in flight before the release.
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
// and corrects bucket levels from rate-limit headers
// (docs/design.md#dual-admission).
func (p *Permit) Settle(res Result) {
	if p == nil || !p.done.CompareAndSwap(false, true) {
		return
	}
	g, pl, now := p.g, p.pl, p.g.now()
	pl.untrack(p)
	inflight := p.release()
	kind := res.Class.Kind
	usage := res.PromptTokens+res.CompletionTokens > 0
	switch {
	case kind.RateLimited():
		p.settleRateLimited(now, res.Class)
	case usage && pl.adm != nil && g.strategy == StrategyShaping:
		pl.adm.Adjust(now, DimTokens, -float64(res.CompletionTokens)) // the guide's: settle output only
	case !usage && pl.adm != nil && g.strategy == StrategyAuto && (kind == KindServer || kind == KindClient):
		// An error answer generated no output: keep the input booked (a
		// provider may count it) and give back the rest.
		in := p.booked - p.outBooked
		pl.repace(now, in-p.res.Cost.Get(DimTokens))
		pl.adm.Settle(now, p.res, flow.Cost{{Dim: DimTokens, N: in}})
	case usage && pl.adm != nil:
		actual := float64(res.PromptTokens + res.CompletionTokens)
		if g.strategy == StrategyAuto {
			pl.repace(now, actual-p.res.Cost.Get(DimTokens))
		}
		pl.adm.Settle(now, p.res, flow.Cost{{Dim: DimTokens, N: actual}})
	}
	if kind == KindOK && usage {
		g.cal.Observe(p.estimate, p.booked, res.PromptTokens, res.CompletionTokens, res.Latency)
	}
	if kind == KindOK && pl.ctl != nil {
		// A success without usage (a task job, whose slot is a running
		// task) still ends a round of the controller's: without it the
		// limit would stay where it started, or where a 429 cut it.
		pl.ctl.OnSuccess(now, res.Latency, res.CompletionTokens, res.PromptTokens+res.CompletionTokens, inflight)
	}
	if g.strategy == StrategyAuto && res.Headers != nil && pl.adm != nil {
		g.correct(now, p.sentAt, pl, parseRateLimitHeaders(res.Headers, now))
	}
	if pl.ctl != nil {
		pl.sem.SetLimit(pl.ctl.Limit())
	}
	pl.wake()
}

// settleRateLimited settles a call the provider refused with a 429.
func (p *Permit) settleRateLimited(now time.Time, c Classification) {
	g, pl := p.g, p.pl
	g.rateLimited.Add(1)
	// A token 429 that came while auto's log held the minute near TPM
	// was foreseen: what the log could not know (output still unknown,
	// the provider counting a few ms after the send) tipped a full
	// minute over. The clamp corrects the log; cutting the send rate,
	// as for a limit the provider lowered, would idle the next seconds.
	foreseen := c.Kind == KindRateLimitTokens && pl.tokensNearFull(now, p.sentAt)
	if pl.adm != nil && g.strategy != StrategyShaping {
		// A rejected call used no tokens; the request stays booked.
		pl.adm.Settle(now, p.res, flow.Cost{{Dim: DimTokens, N: 0}})
		pl.clampFor(now, c.Kind)
	}
	if pl.rcap != nil && !foreseen {
		pl.rcap.OnRateLimit(now, p.sentAt, p.paced, c.Kind == KindRateLimitBurst)
	}
	if pl.ctl != nil {
		pl.ctl.OnRateLimit(now, p.sentAt, c.RetryAfter)
		g.log.Info("rate limited: draining", "kind", c.Kind.String(), "code", c.Code,
			"concurrency_limit", pl.ctl.Limit(), "retry_after", c.RetryAfter)
	}
}

// correct lowers bucket levels to what the provider says remains, less the
// tokens booked by calls still in flight: the provider may not have counted
// them yet, or (counting at admission) knows their output before llmq does,
// and either way settlement will bring them in. auto's token log compares
// the figure with the minute of the call it answered for, since providers
// report their count when they admit a call; a bucket can only take it as
// of now.
func (g *Governor) correct(now, sentAt time.Time, pl *pipeline, info rateLimitInfo) {
	if info.hasRequests() {
		pl.adm.Clamp(now, DimRequests, info.RemainingRequests)
	}
	if !info.hasTokens() {
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
func (pl *pipeline) clampFor(now time.Time, k Kind) {
	switch k {
	case KindRateLimitRequests:
		pl.adm.Clamp(now, DimRequests, 0)
	case KindRateLimitTokens:
		pl.adm.Clamp(now, DimTokens, 0)
	}
}
