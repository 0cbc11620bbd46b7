package ratecontrol

import (
	"math"
	"time"
)

// tokenRateLocked is the per-second token rate sends are spaced at (0 = none).
func (pl *pipeline) tokenRateLocked() float64 {
	var r float64
	if pl.lim.TPM > 0 {
		r = (pl.lim.TPM - pl.margin) / 60
	}
	if pl.lim.TPS > 0 {
		r = minPositive(r, pl.lim.TPS*0.9)
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
func (pl *pipeline) noteCost(now time.Time, booked float64, r reserveInput) float64 {
	pl.marginMu.Lock()
	defer pl.marginMu.Unlock()
	if pl.tokLog == nil {
		return pl.tokenRateLocked()
	}
	if pl.meanCost > 0 {
		pl.meanCost = (1-meanCostAlpha)*pl.meanCost + meanCostAlpha*booked
	} else {
		pl.meanCost = booked
	}
	stat := 0.0
	switch {
	case r.ok:
		stat = r.scale * min(r.sigmas*math.Sqrt(r.uncharged.variance), r.uncharged.worst)
	case pl.meanCost > 0:
		n := min(pl.lim.TPM/pl.meanCost, marginCalls*r.inflight/pl.meanCost+2)
		stat = r.scale * r.sigmas * math.Sqrt(n) * r.outDev
	}
	want := tokenMargin(pl.lim.TPM, stat)
	// Up at once (the worst case, when it binds, is exact: any less can
	// overrun); down only by a fifth or more, so the rate does not twitch.
	if want > pl.margin || want < pl.margin*0.8 {
		pl.margin = want
		pl.tokLog.SetRate(now, 0, (pl.lim.TPM-pl.margin)/60)
	}
	return pl.tokenRateLocked()
}

// reserveInput is what noteCost sizes the reserve from.
type reserveInput struct {
	sigmas, scale float64         // WithTokenReserve, Calibrator.Booking
	uncharged     unchargedOutput // of the calls in flight and the new one, if ok
	ok            bool
	inflight      float64 // tokens booked by calls in flight
	outDev        float64 // Calibrator.Booking
}

// meanCostAlpha is the weight of a new booking in the EMA of booked costs.
const meanCostAlpha = 0.2

// marginCalls is how many deviations per call in flight the margin covers.
const marginCalls = 2.0

// tokenMargin is the reserve, at least autoTokenFloorPct and at most half
// the quota.
func tokenMargin(tpm, stat float64) float64 {
	return min(max(tpm*autoTokenFloorPct, stat), tpm/2)
}

// defaultTokenReserve is auto's statistical reserve for the output still
// unknown, in standard deviations (see noteCost and WithTokenReserve).
const defaultTokenReserve = 5.5

// tokensNearFull reports whether auto's token log held the minute ending at
// at within nearFullSlack of its limit (TPM less the reserve): a provider's
// token 429 for a call sent then is what the reserve is sized to make rare,
// not a sign of a lower limit.
func (pl *pipeline) tokensNearFull(now, at time.Time) bool {
	if pl.tokLog == nil {
		return false
	}
	pl.marginMu.Lock()
	tpm, margin := pl.lim.TPM, pl.margin
	pl.marginMu.Unlock()
	return pl.tokLog.SumAt(now, at) >= tpm-margin-nearFullSlack*tpm
}

// nearFullSlack is how far below its limit (a share of TPM) auto's token log
// may be for a token 429 to count as foreseen.
const nearFullSlack = 0.03
