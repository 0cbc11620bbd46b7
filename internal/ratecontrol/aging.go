package ratecontrol

import (
	"time"
)

// agingTick is how often auto re-prices the calls in flight (at most; it
// happens inside admissions, so an idle governor does no work).
const agingTick = 100 * time.Millisecond

// track registers a granted auto permit for aging.
func (pl *pipeline) track(p *Permit) {
	if pl.tokMin == nil {
		return
	}
	p.tokIdx = -1
	for i, a := range p.res.Cost {
		if a.Dim == DimTokens {
			p.tokIdx = i
		}
	}
	if p.tokIdx < 0 {
		return
	}
	p.tracked = true
	pl.ageMu.Lock()
	p.ageIdx = len(pl.aging)
	pl.aging = append(pl.aging, p)
	pl.ageMu.Unlock()
}

// untrack removes p from aging; from then on p.res and p.extra are stable.
func (pl *pipeline) untrack(p *Permit) {
	if !p.tracked {
		return
	}
	p.tracked = false
	pl.ageMu.Lock()
	last := len(pl.aging) - 1
	moved := pl.aging[last]
	pl.aging[p.ageIdx] = moved
	moved.ageIdx = p.ageIdx
	pl.aging[last] = nil
	pl.aging = pl.aging[:last]
	pl.ageMu.Unlock()
}

// age re-prices the calls in flight: a call still unanswered after a
// seconds is charged the mean output of past calls that took longer than a,
// if that is more than it booked. Why: the provider counts a call's whole
// output in the minute it was sent, while settlement only learns it when the
// answer ends; long answers are the slow ones, so without aging their
// excess reaches the bucket up to a minute late and a sliding minute can
// hold more than TPM. With it the excess is charged within seconds, as soon
// as the call has outlived the short answers. It returns the tokens charged.
func (pl *pipeline) age(now time.Time, cal *Calibrator) float64 {
	pl.ageMu.Lock()
	defer pl.ageMu.Unlock()
	if len(pl.aging) == 0 || now.Sub(pl.agedAt) < agingTick {
		return 0
	}
	pl.agedAt = now
	st := cal.Survival()
	var total float64
	for _, p := range pl.aging {
		out, ok := st.OutputGivenAge(now.Sub(p.sentAt))
		if !ok {
			return 0
		}
		if p.maxOut > 0 {
			out = min(out, p.maxOut)
		}
		if d := out - p.outBooked - p.extra; d > 0 {
			p.extra += d
			p.res.Cost[p.tokIdx].N += d
			pl.adm.AdjustReservation(now, p.res, DimTokens, -d)
			total += d
		}
	}
	return total
}
