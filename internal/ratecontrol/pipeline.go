package ratecontrol

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// pipeline is one configuration of a Governor's parts. SetLimits either
// retunes it in place (same shape) or replaces it.
type pipeline struct {
	lim Limits
	adm *Admission // nil: no admission control
	// gate, when set, lets one caller at a time reserve and wait (FIFO):
	// each reservation is made when the previous one is granted, so
	// settlements and refunds that arrive meanwhile count for everyone
	// behind, instead of send times being booked far ahead (auto, adaptive).
	gate *ConcurrencyLimiter
	// freed wakes auto's caller waiting at the head for room in the token
	// log when a settlement or refund may have made some (waiting: one is).
	freed   chan struct{}
	waiting atomic.Bool
	sem     *ConcurrencyLimiter
	pacer   *Pacer
	ctl     *Controller
	// rcap (auto) scales the pacer's gaps down after 429s the buckets did
	// not foresee (burst rule, a limit lowered without notice).
	rcap  *rateCap
	shape [4]bool // which of RPM, RPS, TPM, TPS limiters exist
	// the limiters, to retune in place
	reqMin, reqSec, tokMin, tokSec Limiter
	tokLog                         *WindowLog // auto's tokMin

	// auto's token margin: the TPM window log (tokLog) admits TPM − margin
	// a minute, where margin is the statistical reserve for the output of
	// the calls still in flight (noteCost).
	marginMu sync.Mutex
	meanCost float64 // EMA of booked token costs
	margin   float64 // margin applied to tokLog

	// auto's aging of calls in flight (aging.go)
	ageMu   sync.Mutex
	aging   []*Permit
	agedAt  time.Time
	unknown unknown         // Σ unknown of aging
	fresh   survivalOutlook // output of a call of any age
	varOK   bool            // the survival table could tell
}

// tokenRateLocked is the per-second token rate sends are spaced at (0 = none).
func (p *pipeline) tokenRateLocked() float64 {
	var r float64
	if p.lim.TPM > 0 {
		r = (p.lim.TPM - p.margin) / 60
	}
	if p.lim.TPS > 0 {
		r = minPositive(r, p.lim.TPS*0.9)
	}
	return r
}

// noteCost updates auto's token margin with a new booking and retunes the
// TPM window log when the margin grew, or shrank by a fifth or more.
//
// The log books every call where the provider counts it and settles it
// there, so what a sliding minute can hold beyond the limit is only the
// output still unknown: that of the calls in flight at its end. Aging makes
// each of those an unbiased guess, whose spread is the conditional variance
// of output given the call's age (a call that has outlived the short
// answers is known to be long). The margin keeps sigmas standard deviations
// of their sum, or its worst case (every call in flight as long as the
// longest answer seen at its age) when that is less: with few calls in
// flight, or outputs of a few fixed lengths, the worst case is the tighter
// bound. The scale widens both while the calibration is young. Until the
// calibration can tell (ok false) the margin is sigmas·scale·sqrt(n)·dev,
// dev being the mean absolute deviation of output lengths and n marginCalls
// per call in flight. With many calls a minute the reserve is a small share
// of TPM.
//
// It returns the token rate sends are spaced at (tokenRate).
func (p *pipeline) noteCost(now time.Time, booked float64, r reserveInput) float64 {
	p.marginMu.Lock()
	defer p.marginMu.Unlock()
	if p.tokLog == nil {
		return p.tokenRateLocked()
	}
	p.meanCost = ema(p.meanCost, booked, 0.2, boolInt(p.meanCost > 0))
	stat := 0.0
	switch {
	case r.ok:
		stat = r.scale * min(r.sigmas*math.Sqrt(r.unknown.vr), r.unknown.hi)
	case p.meanCost > 0:
		n := min(p.lim.TPM/p.meanCost, marginCalls*r.inflight/p.meanCost+2)
		stat = r.scale * r.sigmas * math.Sqrt(n) * r.outDev
	}
	want := tokenMargin(p.lim.TPM, stat)
	// Up at once (the worst case, when it binds, is exact: any less can
	// overrun); down only by a fifth or more, so the rate does not twitch.
	if want > p.margin || want < p.margin*0.8 {
		p.margin = want
		p.tokLog.SetRate(now, 0, (p.lim.TPM-p.margin)/60)
	}
	return p.tokenRateLocked()
}

// reserveInput is what noteCost sizes the reserve from.
type reserveInput struct {
	sigmas, scale float64 // WithTokenReserve, Calibrator.booking
	unknown       unknown // of the calls in flight and the new one, if ok
	ok            bool
	inflight      float64 // tokens booked by calls in flight
	outDev        float64 // Calibrator.booking
}

// marginCalls is how many deviations per call in flight the margin covers.
const marginCalls = 2.0

// tokenMargin is the reserve, at least autoTokenFloorPct and at most half
// the quota.
func tokenMargin(tpm, stat float64) float64 {
	return min(max(tpm*autoTokenFloorPct, stat), tpm/2)
}

// Burst allowances of auto's buckets: a bucket of capacity c and rate r lets
// through at most max(c, largest cost) + r·W in any window W, so auto's
// request bucket refills at (quota − c)/60 per second. Tokens go through a
// WindowLog instead, whose floor keeps a little slack for rounding.
const (
	autoRequestBurst  = 1     // requests
	autoTokenFloorPct = 0.005 // of TPM
	autoIdleRestart   = time.Minute
	autoCooldown      = 250 * time.Millisecond
	autoPacerSlack    = time.Second
	// autoLogGuard keeps each booking in auto's token log this much longer
	// than the provider's minute. A call the log lets go the moment an old
	// booking leaves reaches the provider a few ms after it is sent, as the
	// old one did; when the new one travels faster, the provider still
	// counts the old one. Measured with llmq bench's mixed scenario: one
	// token 429 in ~550 calls without the guard, at a cost of guard/minute
	// of the quota (0.17%) when the log binds.
	autoLogGuard = 100 * time.Millisecond
	// autoSecondGuard: see pacerInterval.
	autoSecondGuard = 10 * time.Millisecond
)

// DefaultTokenReserve is auto's statistical reserve for the output still
// unknown, in standard deviations (see noteCost and WithTokenReserve).
const DefaultTokenReserve = 5.5

func shapeOf(l Limits) [4]bool { return [4]bool{l.RPM > 0, l.RPS > 0, l.TPM > 0, l.TPS > 0} }

// bucketParams returns capacity, rate and initial tokens for one rule.
// quota is per window w (a minute or a second).
func (g *Governor) bucketParams(quota float64, w time.Duration, perSecond, tokens bool) (capacity, rate, initial float64) {
	switch g.strategy {
	case StrategyRateLimit: // seed: capacity = quota, full start
		return quota, quota / w.Seconds(), quota
	case StrategyShaping, StrategyAdaptive: // seed: capacity = quota, empty start
		return quota, quota / w.Seconds(), 0
	}
	// auto: window-safe
	switch {
	case perSecond && !tokens:
		// The pacer spaces requests by 1/RPS, which already keeps any
		// half-open second within RPS; the bucket only books the rate.
		return 1, quota, 0
	case perSecond:
		burst := quota * 0.1
		return burst, quota - burst, 0
	}
	burst := min(autoRequestBurst, quota/2)
	return burst, (quota - burst) / w.Seconds(), 0
}

func (g *Governor) newLimiter(now time.Time, quota float64, w time.Duration, perSecond, tokens bool, warmup time.Duration) Limiter {
	c, r, init := g.bucketParams(quota, w, perSecond, tokens)
	if warmup > 0 {
		wb := NewWarmupBucket(c, r, warmup, now)
		if g.strategy == StrategyAuto {
			wb.SetIdleRestart(autoIdleRestart)
		}
		return wb
	}
	return NewBucket(c, r, init, now)
}

func (g *Governor) build(now time.Time, l Limits) *pipeline {
	p := &pipeline{lim: l, shape: shapeOf(l)}
	if g.strategy == StrategyRetry {
		return p
	}
	var warm time.Duration
	if g.strategy == StrategyShaping || g.strategy == StrategyAuto {
		warm = l.warmup()
	}
	p.adm = NewAdmission()
	if l.RPM > 0 {
		p.reqMin = g.newLimiter(now, l.RPM, time.Minute, false, false, warm)
		p.adm.Add(DimRequests, p.reqMin)
	}
	if l.RPS > 0 {
		p.reqSec = g.newLimiter(now, l.RPS, time.Second, true, false, 0)
		p.adm.Add(DimRequests, p.reqSec)
	}
	if g.strategy != StrategyRateLimit {
		if l.TPM > 0 && g.strategy == StrategyAuto {
			p.margin = tokenMargin(l.TPM, 0)
			p.tokLog = NewWindowLog(time.Minute, l.TPM-p.margin)
			p.tokLog.SetGuard(autoLogGuard)
			p.tokMin = p.tokLog
			p.adm.Add(DimTokens, p.tokMin)
		} else if l.TPM > 0 {
			p.tokMin = g.newLimiter(now, l.TPM, time.Minute, false, true, warm)
			p.adm.Add(DimTokens, p.tokMin)
		}
		if l.TPS > 0 {
			p.tokSec = g.newLimiter(now, l.TPS, time.Second, true, true, 0)
			p.adm.Add(DimTokens, p.tokSec)
		}
	}
	if g.strategy == StrategyAuto || g.strategy == StrategyAdaptive {
		p.gate = NewConcurrencyLimiter(1)
	}
	if p.tokLog != nil {
		p.freed = make(chan struct{}, 1)
	}
	switch g.strategy {
	case StrategyRateLimit, StrategyShaping:
		n := l.MaxConcurrency
		if n <= 0 {
			n = DefaultSemaphore
		}
		p.sem = NewConcurrencyLimiter(n)
	case StrategyAdaptive, StrategyAuto:
		cfg := g.ctlCfg
		cfg.Max = float64(l.MaxConcurrency)
		cfg.QuotaRPS, cfg.QuotaTPS = l.requestRate(), l.tokenRate()
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
		p.ctl = NewController(cfg, now)
		p.sem = NewConcurrencyLimiter(p.ctl.Limit())
	}
	switch {
	case (g.strategy == StrategyShaping || g.strategy == StrategyAuto) && l.requestRate() > 0:
		p.pacer = NewPacer(g.pacerInterval(l))
	case g.strategy == StrategyAuto && l.tokenRate() > 0:
		p.pacer = NewPacer(0) // token spacing only
	}
	if g.strategy == StrategyAuto && p.pacer != nil {
		p.rcap = newRateCap(now)
		// the turnstile can hold a send up for a concurrency slot; the
		// token log, not the pacer, is auto's limit
		p.pacer.SetSlack(autoPacerSlack)
	}
	return p
}

// retune applies new limits to p in place when the shape is unchanged.
func (g *Governor) retune(now time.Time, p *pipeline, l Limits) bool {
	if shapeOf(l) != p.shape || l.warmup() != p.limits().warmup() {
		return false
	}
	set := func(lm Limiter, quota float64, w time.Duration, perSecond, tokens bool) {
		if lm != nil {
			c, r, _ := g.bucketParams(quota, w, perSecond, tokens)
			lm.SetRate(now, c, r)
		}
	}
	set(p.reqMin, l.RPM, time.Minute, false, false)
	set(p.reqSec, l.RPS, time.Second, true, false)
	if p.tokLog != nil {
		p.marginMu.Lock()
		p.margin *= l.TPM / max(p.lim.TPM, 1) // the reserve's share of TPM stays until noteCost reprices it
		p.lim.TPM = l.TPM
		p.tokLog.SetLimit(now, l.TPM-p.margin)
		p.marginMu.Unlock()
	} else {
		set(p.tokMin, l.TPM, time.Minute, false, true)
	}
	set(p.tokSec, l.TPS, time.Second, true, true)
	if p.pacer != nil && l.requestRate() > 0 {
		p.pacer.SetInterval(g.pacerInterval(l))
	}
	switch {
	case p.ctl != nil:
		p.ctl.SetQuota(l.requestRate(), l.tokenRate(), float64(l.MaxConcurrency))
		p.sem.SetLimit(p.ctl.Limit())
	case p.sem != nil:
		n := l.MaxConcurrency
		if n <= 0 {
			n = DefaultSemaphore
		}
		p.sem.SetLimit(n)
	}
	p.marginMu.Lock()
	p.lim = l
	p.marginMu.Unlock()
	return true
}

// limits reads the current limits (retune may change them).
func (p *pipeline) limits() Limits {
	p.marginMu.Lock()
	defer p.marginMu.Unlock()
	return p.lim
}

// wake tells the caller waiting for room in the token log, if any, to look
// again.
func (p *pipeline) wake() {
	if p.freed != nil && p.waiting.Load() {
		select {
		case p.freed <- struct{}{}:
		default:
		}
	}
}

// tokensNearFull reports whether auto's token log held the minute ending at
// at within nearFullSlack of its limit (TPM less the reserve): a provider's
// token 429 for a call sent then is what the reserve is sized to make rare,
// not a sign of a lower limit.
func (p *pipeline) tokensNearFull(now, at time.Time) bool {
	if p.tokLog == nil {
		return false
	}
	p.marginMu.Lock()
	tpm, margin := p.lim.TPM, p.margin
	p.marginMu.Unlock()
	return p.tokLog.SumAt(now, at) >= tpm-margin-nearFullSlack*tpm
}

// nearFullSlack is how far below its limit (a share of TPM) auto's token log
// may be for a token 429 to count as foreseen.
const nearFullSlack = 0.03

// pacerInterval is the gap between sends at the request rate. auto leaves
// autoSecondGuard of every second unused when a per-second limit binds:
// sends paced at exactly 1/RPS reach the provider with a few ms of jitter,
// and 21 of them then land in one second of a 20 RPS limit (llmq bench's
// halving scenario: a 429 every ~8 s before the halving, each cutting the
// rate for seconds). A minute limit needs no guard here: auto's request
// bucket already keeps one request of the minute back.
func (g *Governor) pacerInterval(l Limits) time.Duration {
	second := time.Second
	if rpsBinds := l.RPS > 0 && (l.RPM <= 0 || l.RPS <= l.RPM/60); rpsBinds && g.strategy == StrategyAuto {
		second += autoSecondGuard
	}
	return time.Duration(float64(second) / l.requestRate())
}
