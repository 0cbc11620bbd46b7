package ratecontrol

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/ratecontrol/flow"
)

// pipeline is one configuration of a Governor's parts. SetLimits either
// retunes it in place (same shape) or replaces it.
type pipeline struct {
	lim Limits
	adm *flow.Admission // nil: no admission control
	// gate, when set, lets one caller at a time reserve and wait (FIFO):
	// each reservation is made when the previous one is granted, so
	// settlements and refunds that arrive meanwhile count for everyone
	// behind, instead of send times being booked far ahead (auto, adaptive).
	gate *flow.ConcurrencyLimiter
	// freed wakes auto's caller waiting at the head for room in the token
	// log when a settlement or refund may have made some (waiting: one is).
	freed   chan struct{}
	waiting atomic.Bool
	sem     *flow.ConcurrencyLimiter
	pacer   *flow.Pacer
	ctl     *flow.Controller
	// rcap (auto) scales the pacer's gaps down after 429s the buckets did
	// not foresee (burst rule, a limit lowered without notice).
	rcap  *flow.RateCap
	shape [4]bool // which of RPM, RPS, TPM, TPS limiters exist
	// the limiters, to retune in place
	reqMin, reqSec, tokMin, tokSec flow.Limiter
	tokLog                         *flow.WindowLog // auto's tokMin

	// auto's token margin: the TPM window log (tokLog) admits TPM − margin
	// a minute, where margin is the statistical reserve for the output of
	// the calls still in flight (noteCost).
	marginMu sync.Mutex
	meanCost float64 // EMA of booked token costs
	margin   float64 // margin applied to tokLog

	// auto's aging of calls in flight (aging.go)
	ageMu     sync.Mutex
	aging     []*Permit
	agedAt    time.Time
	uncharged unchargedOutput // Σ of aging's
	fresh     flow.Outlook    // output of a call of any age
	varOK     bool            // the survival table could tell
}

// Burst allowances of auto's buckets: a bucket of capacity c and rate r lets
// through at most max(c, largest cost) + r·W in any window W, so auto's
// request bucket refills at (quota − c)/60 per second. Tokens go through a
// WindowLog instead, whose floor keeps a little slack for rounding.
//
// auto's head caller sleeps to its send, and on a busy host the timer
// wakes it milliseconds late. A request bucket of one request dropped what
// came in meanwhile, so wherever the bucket bound below the pacer (a
// warm-up's ramp) auto sent well below its rate; and the pacer, once it
// bound, started its next slot from the late wake, which lost the same
// (BENCHMARKS.md, "A ramp that lost its late tokens"). So a request bucket
// holds autoLateness of its rate, at least one request (while it warms up,
// of the ramp's rate: SetRampedCapacity), and the pacer lets a booking up
// to autoLateness after its next slot take that slot (Pacer.SetLateness).
// Both only let a late head catch up with a schedule whose interval stays
// as it was: after a pause the pacer starts from now and spaces out what
// the bucket holds.
const (
	autoRequestBurst  = 1 // requests, at least
	autoLateness      = 5 * time.Millisecond
	autoTokenFloorPct = 0.005 // of TPM
	autoIdleRestart   = time.Minute
	autoCooldown      = 250 * time.Millisecond
	autoPacerSlack    = time.Second
	// autoLogGuard keeps each booking in auto's token log this much longer
	// than the provider's minute. A call the log lets go the moment an old
	// booking leaves reaches the provider a few ms after it is sent, as the
	// old one did; when the new one travels faster, the provider still
	// counts the old one. It costs guard/minute of the quota (0.17%) when
	// the log binds.
	autoLogGuard = 100 * time.Millisecond
	// autoSecondGuard: see pacerInterval.
	autoSecondGuard = 10 * time.Millisecond
)

func shapeOf(l Limits) [4]bool { return [4]bool{l.RPM > 0, l.RPS > 0, l.TPM > 0, l.TPS > 0} }

// bucketParams returns capacity, rate and initial tokens for one rule
// (docs/design.md#strategies). quota is per window w (a minute or a
// second).
func (g *Governor) bucketParams(quota float64, w time.Duration, perSecond, tokens bool) (capacity, rate, initial float64) {
	switch g.strategy {
	case StrategyRateLimit: // the guide's: capacity = quota, full start
		return quota, quota / w.Seconds(), quota
	case StrategyShaping, StrategyAdaptive: // the guide's: capacity = quota, empty start
		return quota, quota / w.Seconds(), 0
	}
	// auto: window-safe
	switch {
	case perSecond && !tokens:
		// The pacer spaces requests by 1/RPS, which already keeps any
		// half-open second within RPS; the bucket only books the rate.
		return lateBurst(quota), quota, 0
	case perSecond:
		burst := quota * 0.1
		return burst, quota - burst, 0
	}
	burst := min(lateBurst(quota/w.Seconds()), quota/2)
	return burst, (quota - burst) / w.Seconds(), 0
}

// lateBurst is the capacity of auto's request bucket at perSecond
// requests a second: autoLateness of them, at least autoRequestBurst.
func lateBurst(perSecond float64) float64 {
	return max(autoRequestBurst, perSecond*autoLateness.Seconds())
}

func (g *Governor) newLimiter(now time.Time, quota float64, w time.Duration, perSecond, tokens bool, warmup time.Duration) flow.Limiter {
	c, r, init := g.bucketParams(quota, w, perSecond, tokens)
	if warmup > 0 {
		wb := flow.NewWarmupBucket(c, r, warmup, now)
		if g.strategy == StrategyAuto {
			wb.SetIdleRestart(autoIdleRestart)
			if !tokens {
				wb.SetRampedCapacity(autoRequestBurst)
			}
		}
		return wb
	}
	return flow.NewBucket(c, r, init, now)
}

// warmups returns the pipeline's warm-up buckets.
func (pl *pipeline) warmups() []*flow.WarmupBucket {
	var out []*flow.WarmupBucket
	for _, l := range []flow.Limiter{pl.reqMin, pl.reqSec, pl.tokMin} {
		if wb, ok := l.(*flow.WarmupBucket); ok {
			out = append(out, wb)
		}
	}
	return out
}

func (g *Governor) build(now time.Time, l Limits) *pipeline {
	pl := &pipeline{lim: l, shape: shapeOf(l)}
	if g.strategy == StrategyRetry {
		return pl
	}
	var warm time.Duration
	if g.strategy == StrategyShaping || g.strategy == StrategyAuto {
		warm = l.warmup()
	}
	pl.adm = flow.NewAdmission()
	if l.RPM > 0 {
		pl.reqMin = g.newLimiter(now, l.RPM, time.Minute, false, false, warm)
		pl.adm.Add(DimRequests, pl.reqMin)
	}
	if l.RPS > 0 {
		// auto warms up a per-second request limit as it does the minute's:
		// a growth-rate rule watches the traffic whatever limit binds, and
		// without it a start, or a restart after idle, goes at the full RPS
		// from the first call.
		var secWarm time.Duration
		if g.strategy == StrategyAuto {
			secWarm = warm
		}
		pl.reqSec = g.newLimiter(now, l.RPS, time.Second, true, false, secWarm)
		pl.adm.Add(DimRequests, pl.reqSec)
	}
	if g.strategy != StrategyRateLimit {
		if l.TPM > 0 && g.strategy == StrategyAuto {
			pl.margin = tokenMargin(l.TPM, 0)
			pl.tokLog = flow.NewWindowLog(time.Minute, l.TPM-pl.margin)
			pl.tokLog.SetGuard(autoLogGuard)
			pl.tokMin = pl.tokLog
			pl.adm.Add(DimTokens, pl.tokMin)
		} else if l.TPM > 0 {
			pl.tokMin = g.newLimiter(now, l.TPM, time.Minute, false, true, warm)
			pl.adm.Add(DimTokens, pl.tokMin)
		}
		if l.TPS > 0 {
			pl.tokSec = g.newLimiter(now, l.TPS, time.Second, true, true, 0)
			pl.adm.Add(DimTokens, pl.tokSec)
		}
	}
	if g.strategy == StrategyAuto || g.strategy == StrategyAdaptive {
		pl.gate = flow.NewConcurrencyLimiter(1)
	}
	if pl.tokLog != nil {
		pl.freed = make(chan struct{}, 1)
	}
	switch g.strategy {
	case StrategyRateLimit, StrategyShaping:
		n := l.MaxConcurrency
		if n <= 0 {
			n = defaultSemaphore
		}
		pl.sem = flow.NewConcurrencyLimiter(n)
	case StrategyAdaptive, StrategyAuto:
		cfg := g.ctlCfg
		cfg.Max = float64(l.MaxConcurrency)
		cfg.QuotaRPS, cfg.QuotaTPS = l.requestRate(), l.tokenRate()
		if g.fullStart && l.MaxConcurrency > 0 {
			cfg.Initial = float64(l.MaxConcurrency)
		}
		if cfg.Initial <= 0 && cfg.QuotaRPS > 0 {
			// Cold start: as many slots as one second of the request quota
			// (a 1 s call keeps that busy); the buckets cap the rate anyway.
			cfg.Initial = max(4, math.Ceil(cfg.QuotaRPS))
		}
		if g.strategy == StrategyAuto && cfg.Cooldown <= 0 {
			// auto's rate cap slows the sends on a 429; the drain only
			// needs to let the cut take hold (Retry-After still applies).
			cfg.Cooldown = autoCooldown
		}
		pl.ctl = flow.NewController(cfg, now)
		pl.sem = flow.NewConcurrencyLimiter(pl.ctl.Limit())
	}
	switch {
	case (g.strategy == StrategyShaping || g.strategy == StrategyAuto) && l.requestRate() > 0:
		pl.pacer = flow.NewPacer(g.pacerInterval(l))
	case g.strategy == StrategyAuto && l.tokenRate() > 0:
		pl.pacer = flow.NewPacer(0) // token spacing only
	}
	if g.strategy == StrategyAuto && pl.pacer != nil {
		pl.rcap = flow.NewRateCap(now)
		// the turnstile can hold a send up for a concurrency slot; the
		// token log, not the pacer, is auto's limit
		pl.pacer.SetSlack(autoPacerSlack)
		pl.pacer.SetLateness(autoLateness)
	}
	return pl
}

// retune applies new limits to pl in place when the shape is unchanged.
func (g *Governor) retune(now time.Time, pl *pipeline, l Limits) bool {
	if shapeOf(l) != pl.shape || l.warmup() != pl.limits().warmup() {
		return false
	}
	set := func(lm flow.Limiter, quota float64, w time.Duration, perSecond, tokens bool) {
		if lm != nil {
			c, r, _ := g.bucketParams(quota, w, perSecond, tokens)
			lm.SetRate(now, c, r)
		}
	}
	set(pl.reqMin, l.RPM, time.Minute, false, false)
	set(pl.reqSec, l.RPS, time.Second, true, false)
	if pl.tokLog != nil {
		pl.marginMu.Lock()
		pl.margin *= l.TPM / max(pl.lim.TPM, 1) // the reserve's share of TPM stays until noteCost reprices it
		pl.lim.TPM = l.TPM
		pl.tokLog.SetLimit(now, l.TPM-pl.margin)
		pl.marginMu.Unlock()
	} else {
		set(pl.tokMin, l.TPM, time.Minute, false, true)
	}
	set(pl.tokSec, l.TPS, time.Second, true, true)
	if pl.pacer != nil && l.requestRate() > 0 {
		pl.pacer.SetInterval(g.pacerInterval(l))
	}
	switch {
	case pl.ctl != nil:
		pl.ctl.SetQuota(l.requestRate(), l.tokenRate(), float64(l.MaxConcurrency))
		pl.sem.SetLimit(pl.ctl.Limit())
	case pl.sem != nil:
		n := l.MaxConcurrency
		if n <= 0 {
			n = defaultSemaphore
		}
		pl.sem.SetLimit(n)
	}
	pl.marginMu.Lock()
	pl.lim = l
	pl.marginMu.Unlock()
	return true
}

// rpsBinds reports whether a per-second request limit is the binding
// request limit, so that the pacer's interval is what holds it.
func rpsBinds(l Limits) bool { return l.RPS > 0 && (l.RPM <= 0 || l.RPS <= l.RPM/60) }

// limits reads the current limits (retune may change them).
func (pl *pipeline) limits() Limits {
	pl.marginMu.Lock()
	defer pl.marginMu.Unlock()
	return pl.lim
}

// wake tells the caller waiting for room in the token log, if any, to look
// again.
func (pl *pipeline) wake() {
	if pl.freed != nil && pl.waiting.Load() {
		select {
		case pl.freed <- struct{}{}:
		default:
		}
	}
}

// pacerInterval is the gap between sends at the request rate. auto leaves
// autoSecondGuard of every second unused when a per-second limit binds:
// sends paced at exactly 1/RPS reach the provider with a few ms of jitter,
// and then RPS + 1 of them land in one second of the provider's, a 429
// that cuts the rate for seconds (docs/design.md#pacer). And it leaves
// autoLateness of every second unused whatever limit binds: its pacer lets
// the sends behind a late head catch up with up to that much of the
// schedule (Pacer.SetLateness), so a second of sends may hold that much
// more of the schedule's slots, and a provider that counts RPM/60 a
// second, or an RPS rule just above RPM/60 that does not bind here, would
// see them.
func (g *Governor) pacerInterval(l Limits) time.Duration {
	second := time.Second
	if g.strategy == StrategyAuto {
		second += autoLateness
		if rpsBinds(l) {
			second += autoSecondGuard
		}
	}
	return time.Duration(float64(second) / l.requestRate())
}
