package quota

import (
	"math"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ratecontrol"
)

// Demand is what a replica wanted of one model over the last interval, per
// second: requests and tokens (admitted plus what it would have sent had
// its share allowed). The coordinator caps each at the model's limit.
type Demand struct {
	Requests float64 // requests per second
	Tokens   float64 // tokens per second
}

// Share is a fraction (0..1) of a model's limits: Requests applies to RPM,
// RPS and max_concurrency, Tokens to TPM and TPS.
type Share struct {
	Requests float64
	Tokens   float64
}

// Member is one live row of quota_members as a round read it.
type Member struct {
	ReplicaID string
	Demand    Demand
	Share     Share // the share the replica has applied to its governor
}

// shareEpsilon keeps the floating-point sum of shares strictly within 1.
const shareEpsilon = 1e-9

// rates are a model's binding per-second rates, one per unit (0 = none).
func rates(m config.Model) (req, tok float64) {
	return minPositive(m.RPM/60, m.RPS), minPositive(m.TPM/60, m.TPS)
}

func minPositive(a, b float64) float64 {
	switch {
	case a <= 0:
		return math.Max(b, 0)
	case b <= 0:
		return a
	}
	return math.Min(a, b)
}

// weight is one replica's claim on a unit of capacity limit: its demand,
// capped at the whole limit (a replica under a full backlog wants all of
// it, so equal backlogs split equally) and floored at floor so an idle
// replica keeps a small slice and can start.
func weight(demand, limit, floor float64) float64 {
	if limit <= 0 {
		return 1 // no limit on this unit: split evenly
	}
	return math.Max(math.Min(math.Max(demand, 0), limit), floor)
}

// Target is the demand-weighted share of self among members:
// limit × max(demand_i, floor) / Σ max(demand_j, floor) per unit, where
// floor = floorFrac × limit / N. The targets of all members computed from
// one read sum to exactly 1 per unit.
func Target(self string, members []Member, m config.Model, floorFrac float64) Share {
	n := float64(len(members))
	if n == 0 {
		return Share{}
	}
	reqLim, tokLim := rates(m)
	var sumR, sumT, selfR, selfT float64
	found := false
	for _, mb := range members {
		r := weight(mb.Demand.Requests, reqLim, floorFrac*reqLim/n)
		t := weight(mb.Demand.Tokens, tokLim, floorFrac*tokLim/n)
		sumR += r
		sumT += t
		if mb.ReplicaID == self {
			selfR, selfT, found = r, t, true
		}
	}
	if !found || sumR <= 0 || sumT <= 0 {
		return Share{}
	}
	return Share{Requests: selfR / sumR, Tokens: selfT / sumT}
}

// Next is the share self applies after a round: its target, but never more
// than the headroom the other members' APPLIED shares leave (1 − Σ others).
// Because every replica raises its share only through Next, inside a
// transaction that holds the model's lock, the applied shares of live
// members never sum above 1 — whatever the timing of rounds, demand changes,
// joins and leaves.
//
// A replica whose applied share is already positive never drops to 0 here
// (its target is positive and the invariant leaves it at least its own
// share as headroom), so only a newcomer waits at 0 for room.
func Next(self string, members []Member, target, current Share) Share {
	var othersR, othersT float64
	for _, mb := range members {
		if mb.ReplicaID != self {
			othersR += mb.Share.Requests
			othersT += mb.Share.Tokens
		}
	}
	next := func(target, cur, others float64) float64 {
		head := 1 - others - shareEpsilon
		v := math.Min(target, head)
		if v < 0 {
			v = 0
		}
		if v <= 0 && cur > 0 {
			// Only when the invariant is already broken (recovering from a
			// fallback share): keep a positive share no larger than before
			// while the others shrink to their targets (they see the excess
			// too), rather than pausing, which would stall the governor.
			v = math.Min(cur, target)
		}
		return math.Min(v, 1)
	}
	return Share{
		Requests: next(target.Requests, current.Requests, othersR),
		Tokens:   next(target.Tokens, current.Tokens, othersT),
	}
}

// pausedQuota is what a dimension with share 0 is set to. ratecontrol reads
// 0 as "no limit", so a paused dimension keeps a tiny positive quota (and its
// shape, so the governor retunes in place instead of rebuilding); 1e-6 per
// window keeps every derived wait and pacer interval within a Duration.
const pausedQuota = 1e-6

// Limits turns a share of model m into governor limits. Dimensions m does
// not limit stay 0 (none). max_concurrency (llmq's own cap, not a provider
// quota) gets ⌊share × max⌋, but at least 1, since ratecontrol reads 0 as
// its default and a replica needs a slot to use its rate share at all: the
// slots may exceed max_concurrency by the replicas whose share is below one
// slot. The provider's dimensions (RPM, TPM, RPS, TPS) are never exceeded.
// A paused share (0) keeps max_concurrency whole: its rates admit nothing.
func Limits(m config.Model, s Share) ratecontrol.Limits {
	scale := func(quota, f float64) float64 {
		if quota <= 0 {
			return 0
		}
		return math.Max(quota*f, pausedQuota)
	}
	l := ratecontrol.Limits{
		RPM:    scale(m.RPM, s.Requests),
		RPS:    scale(m.RPS, s.Requests),
		TPM:    scale(m.TPM, s.Tokens),
		TPS:    scale(m.TPS, s.Tokens),
		Warmup: m.Warmup,
	}
	switch {
	case m.MaxConcurrency > 0 && s.Requests <= 0:
		// Paused: the rates admit nothing; keeping the slots spares the
		// adaptive controller a clamp of its limit and watermark to 1.
		l.MaxConcurrency = m.MaxConcurrency
	case m.MaxConcurrency > 0:
		l.MaxConcurrency = max(1, int(math.Floor(float64(m.MaxConcurrency)*s.Requests+1e-6)))
	}
	return l
}

// less reports whether a is below b in either unit (a decrease to apply at
// once); more whether above in either (an increase to apply only once
// published).
func less(a, b Share) bool { return a.Requests < b.Requests || a.Tokens < b.Tokens }

// changed reports a difference worth a SetLimits call: any decrease, or an
// increase of more than 0.1% of the quota.
func changed(next, cur Share) bool {
	const minStep = 1e-3
	return less(next, cur) || next.Requests-cur.Requests > minStep || next.Tokens-cur.Tokens > minStep
}
