package ratecontrol

import (
	"time"

	"github.com/llmq/llmq/internal/ratecontrol/flow"
)

// agingTick is how often auto re-prices the calls in flight (at most; it
// happens inside admissions, so an idle governor does no work).
const agingTick = 100 * time.Millisecond

// track registers a granted auto permit for aging.
func (pl *pipeline) track(p *Permit) {
	if pl.tokLog == nil {
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
	pl.uncharged = pl.uncharged.plus(p.uncharged)
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
	pl.uncharged = pl.uncharged.minus(p.uncharged)
	pl.ageMu.Unlock()
}

// unchargedOutput is what calls in flight may still add to their charges
// once their output is known: the variance of the sum (their outputs'
// conditional variances, summed as independent) and its worst case (each
// call's largest output seen at its age, less its charge).
type unchargedOutput struct{ variance, worst float64 }

func (u unchargedOutput) plus(v unchargedOutput) unchargedOutput {
	return unchargedOutput{u.variance + v.variance, u.worst + v.worst}
}

func (u unchargedOutput) minus(v unchargedOutput) unchargedOutput {
	return unchargedOutput{max(u.variance-v.variance, 0), max(u.worst-v.worst, 0)}
}

// unchargedOf is what one call whose output is charged as charged may
// still add, given what calls of its age produced (o), capped at maxOut
// (0 = none).
func unchargedOf(o flow.Outlook, charged, maxOut float64) unchargedOutput {
	hi := o.Max
	if maxOut > 0 {
		hi = min(hi, maxOut)
	}
	return unchargedOutput{o.Variance, max(hi-charged, 0)}
}

// inflightUncharged is what the calls in flight, plus a new call that
// books out output tokens (capped at maxOut), may still add, and false
// while the calibration cannot tell. The second result is the new call's
// own.
func (pl *pipeline) inflightUncharged(out, maxOut float64) (total, own unchargedOutput, ok bool) {
	pl.ageMu.Lock()
	defer pl.ageMu.Unlock()
	own = unchargedOf(pl.fresh, out, maxOut)
	return pl.uncharged.plus(own), own, pl.varOK
}

// age re-prices the calls in flight: a call still unanswered after a
// seconds is charged the mean output of past calls that took longer than a,
// if that is more than it booked. Why: the provider counts a call's whole
// output in the minute it was sent, while settlement only learns it when the
// answer ends; long answers are the slow ones, so without aging their
// excess reaches the bucket up to a minute late and a sliding minute can
// hold more than TPM. With it the excess is charged within seconds, as soon
// as the call has outlived the short answers. It returns the tokens charged.
func (pl *pipeline) age(now time.Time, cal *flow.Calibrator) float64 {
	pl.ageMu.Lock()
	defer pl.ageMu.Unlock()
	if now.Sub(pl.agedAt) < agingTick {
		return 0
	}
	pl.agedAt = now
	st := cal.Survival()
	pl.fresh, pl.varOK = st.OutputGivenAge(0)
	if !pl.varOK {
		return 0
	}
	var total float64
	var sum unchargedOutput
	for _, p := range pl.aging {
		o, _ := st.OutputGivenAge(now.Sub(p.sentAt))
		out := o.Mean
		if p.maxOut > 0 {
			out = min(out, p.maxOut)
		}
		if d := out - p.outBooked - p.extra; d > 0 {
			p.extra += d
			p.res.Cost[p.tokIdx].N += d
			pl.adm.AdjustReservation(now, p.res, DimTokens, -d)
			total += d
		}
		p.uncharged = unchargedOf(o, p.outBooked+p.extra, p.maxOut)
		sum = sum.plus(p.uncharged)
	}
	pl.uncharged = sum
	pl.repace(now, total)
	return total
}

// repace moves auto's token pacer by the gap that tokens charged (> 0) or
// given back (< 0) after the booking stand for, so sends are spaced by what
// calls use. Early bookings run low (the first answers to settle are the
// short ones); without this the pacer would send at the booked rate and the
// log would stop sends for seconds once a minute filled.
func (pl *pipeline) repace(now time.Time, tokens float64) {
	if pl.pacer == nil || tokens == 0 {
		return
	}
	pl.marginMu.Lock()
	r := pl.tokenRateLocked()
	pl.marginMu.Unlock()
	if r > 0 {
		pl.pacer.Shift(now, time.Duration(tokens/r*float64(time.Second)))
	}
}
