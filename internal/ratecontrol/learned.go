package ratecontrol

import "github.com/llmq/llmq/internal/ratecontrol/flow"

// Calibration is a calibrator's learned state as plain data (see
// flow.Calibration).
type Calibration = flow.Calibration

// Learned is what a Governor has learned of its model that another
// replica calling the same model through the same account can start from
// instead of cold (internal/quota shares it through Postgres):
//
//   - the calibration: the input-token ratio and the window of last output
//     lengths and latencies. They describe the model and the workload, not
//     the replica, and a cold calibrator books every call at its max_tokens
//     and keeps auto's token reserve twice as wide until its window fills,
//     so a newcomer would use a fraction of its share for its first hundred
//     calls;
//   - auto's rate cap: the share of the configured rate the provider
//     admitted after its last unforeseen 429s. It is a fraction, so it holds
//     for any share of the quota; a newcomer without it sends at the
//     configured rate into a lowered limit and learns from a 429;
//   - the warm-up's progress (Warmth): a replica that joins traffic the
//     provider already sees (a restart, a rolling deploy, one more replica)
//     is no surge to the provider's growth-rate rule, and starting its
//     warm-up from zero would cut the fleet's sending for the warm-up's
//     length on every deploy.
//
// The adaptive controller's concurrency limit is not shared: it follows
// the replica's own share and latencies, and the controller derives it from
// the quota within a second anyway.
type Learned struct {
	Calibration Calibration `json:"calibration"`
	// RateScale is auto's rate cap (1 = uncapped, and for other strategies).
	RateScale float64 `json:"rate_scale"`
	// Warmth is how far the warm-up of a governor in use had come, as a
	// fraction of its rate (flow.WarmupBucket.Warmth; the lowest of its
	// buckets); 0 when it has not sent, has been idle past the slow-start
	// restart, or has no warm-up (nothing to tell a replica that has one).
	Warmth float64 `json:"warmth"`
}

// Learned returns what the governor has learned so far.
func (g *Governor) Learned() Learned {
	now := g.now()
	pl := g.pl.Load()
	l := Learned{Calibration: g.cal.Export(), RateScale: 1}
	if pl.rcap != nil {
		l.RateScale = pl.rcap.Scale(now)
	}
	for i, wb := range pl.warmups() {
		if w := wb.Warmth(now); i == 0 || w < l.Warmth {
			l.Warmth = w
		}
	}
	return l
}

// Adopt starts from what another replica learned: its calibration when
// this governor has seen fewer settled calls (and the calibration is
// plausible), its rate cap when lower than this governor's, its warm-up's
// progress when further than this governor's. It reports what it took.
func (g *Governor) Adopt(l Learned) (calibration, rate, warm bool) {
	calibration = g.cal.Import(l.Calibration)
	now := g.now()
	pl := g.pl.Load()
	if pl.rcap != nil && l.RateScale > 0 && l.RateScale < 1 {
		before := pl.rcap.Scale(now)
		pl.rcap.Adopt(now, l.RateScale)
		rate = pl.rcap.Scale(now) < before
	}
	for _, wb := range pl.warmups() {
		if wb.WarmTo(now, l.Warmth) {
			warm = true
		}
	}
	return calibration, rate, warm
}
