package ratecontrol

import (
	"time"
)

// pipeline is one configuration of a Governor's parts. SetLimits either
// retunes it in place (same shape) or replaces it.
type pipeline struct {
	lim   Limits
	adm   *Admission // nil: no admission control
	sem   *ConcurrencyLimiter
	pacer *Pacer
	ctl   *Controller
	shape [4]bool // which of RPM, RPS, TPM, TPS limiters exist
	// the limiters, to retune in place
	reqMin, reqSec, tokMin, tokSec Limiter
}

// Burst allowances of auto's window-safe buckets: a bucket of capacity c and
// rate r lets through at most c + r·W in any window W, so auto refills at
// (quota − c)/60 per second and never exceeds the quota in any sliding
// minute, while c keeps a little slack for bursts of tiny requests.
const (
	autoRequestBurst  = 1    // requests
	autoTokenBurstPct = 0.01 // of TPM
	autoIdleRestart   = time.Minute
)

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
	case tokens:
		burst := quota * autoTokenBurstPct
		return burst, (quota - burst) / w.Seconds(), 0
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
		if l.TPM > 0 {
			p.tokMin = g.newLimiter(now, l.TPM, time.Minute, false, true, warm)
			p.adm.Add(DimTokens, p.tokMin)
		}
		if l.TPS > 0 {
			p.tokSec = g.newLimiter(now, l.TPS, time.Second, true, true, 0)
			p.adm.Add(DimTokens, p.tokSec)
		}
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
		p.ctl = NewController(cfg, now)
		p.sem = NewConcurrencyLimiter(p.ctl.Limit())
	}
	if (g.strategy == StrategyShaping || g.strategy == StrategyAuto) && l.requestRate() > 0 {
		p.pacer = NewPacer(time.Duration(float64(time.Second) / l.requestRate()))
	}
	return p
}

// retune applies new limits to p in place when the shape is unchanged.
func (g *Governor) retune(now time.Time, p *pipeline, l Limits) bool {
	if shapeOf(l) != p.shape || l.warmup() != p.lim.warmup() {
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
	set(p.tokMin, l.TPM, time.Minute, false, true)
	set(p.tokSec, l.TPS, time.Second, true, true)
	if p.pacer != nil && l.requestRate() > 0 {
		p.pacer.SetInterval(time.Duration(float64(time.Second) / l.requestRate()))
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
	p.lim = l
	return true
}
