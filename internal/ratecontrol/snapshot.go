package ratecontrol

import (
	"time"

	"github.com/llmq/llmq/internal/ratecontrol/flow"
)

// The dimensions of Snapshot.Levels: requests and tokens.
const (
	DimRequests = flow.DimRequests
	DimTokens   = flow.DimTokens
)

// StateDrain is the controller state (Snapshot.Controller.State) after a
// 429: the concurrency limit was cut and admissions wait for the cooldown.
const StateDrain = flow.StateDrain

// Snapshot is a Governor's state for metrics.
type Snapshot struct {
	Strategy         Strategy
	Limits           Limits
	ConcurrencyLimit int // 0 = unlimited
	InFlight         int
	Waiting          int                      // callers queued for a concurrency slot
	Controller       *flow.ControllerSnapshot // nil without a controller
	Levels           map[string]float64       // bucket level per dimension (lowest of its rules)
	PacerInterval    time.Duration
	Calibration      flow.CalibrationSnapshot // input ratio, output length, estimate error
	InFlightTokens   float64
	TokenMargin      float64 // auto: tokens of TPM held back (burst, largest cost, reserve)
	Granted          uint64
	RateLimited      uint64
	// Booked is the tokens booked by every permit granted so far: its
	// growth is the admitted tokens per second (the console's overview).
	Booked float64
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
	s.InFlightTokens, s.Booked = g.inflightTokens, g.bookedTokens
	g.tokMu.Unlock()
	return s
}
