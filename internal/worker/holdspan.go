package worker

import "time"

// holdSpan is how much of a group's own admissions a replica holds in
// memory: a group's hold is Config.TenantHold jobs or what the group was
// admitted in the last holdSpan, whichever is more. A hold of a few jobs
// made sense where the quota binds (a dozen calls a second); where the
// model admits thousands a second, a flood of one tenant parked almost
// every job it read, and each parked job is written once more when it is
// unparked. Fairness does not need the smaller hold: inside a replica the
// dispatcher takes turns among the groups it holds, and a second of a
// group's admissions is what other replicas wait at most before the
// group's parked jobs are theirs to take (docs/design.md#tenants).
const holdSpan = time.Second

// rateWindow is how long a group's admissions are counted before they
// make a rate.
const rateWindow = 100 * time.Millisecond

// admitRate is admissions per second, a moving average over windows of
// rateWindow: one window of a group admitted a few dozen times a second
// holds anything from none to a handful, and a hold that followed it
// would swing enough to return jobs to parking (excess) and unpark them
// again round after round.
type admitRate struct {
	winStart time.Time
	count    int
	perSec   float64
	last     float64 // the last closed window's own rate, idle or not
	measured bool    // a window has closed
}

func (r *admitRate) add(now time.Time) {
	switch el := now.Sub(r.winStart); {
	case r.winStart.IsZero():
		r.winStart = now
	case el >= rateWindow:
		// A window the admissions left idle for a while is no measure of
		// how fast they come: the rate before it stands.
		w := float64(r.count) / el.Seconds()
		r.last = w
		switch {
		case !r.measured:
			r.perSec, r.measured = w, true
		case el < idleWindow:
			r.perSec += rateSmoothing * (w - r.perSec)
		}
		r.winStart, r.count = now, 0
	}
	r.count++
}

// idleWindow is how long a window may run before it counts as idle.
const idleWindow = 3 * rateWindow

// rateSmoothing is the weight of the last window in the average: about
// half a second of windows make it.
const rateSmoothing = 0.2

// at is the rate at now: a window that ran its length with no admission
// to close it counts as it stands, so a group whose admissions stopped
// does not keep the hold they earned.
func (r *admitRate) at(now time.Time) float64 {
	if el := now.Sub(r.winStart); !r.winStart.IsZero() && el >= rateWindow {
		return min(r.perSec, float64(r.count)/el.Seconds())
	}
	return r.perSec
}

// spanHold is what the group g of model was admitted in the last
// holdSpan, at most the worker's MaxInFlight (a group cannot hold more,
// and a job its group has no room for is parked, one UPDATE when it is
// unparked, as is one the worker has no slot for while its group holds
// jobs here: Overflows). A group not yet measured (new, or forgotten
// while it had nothing held) gets what its model was admitted, all
// groups together, in its last busy window: a flood of one tenant on a
// model that ran thousands a second is not parked job by job while its
// own rate is measured, and a group that turns out slower (a tenant over
// its cap) has what it holds beyond its own rate returned to parking
// (excess). Caller holds mu.
func (h *holds) spanHold(g *group, model string, now time.Time) int {
	rate := 0.0
	switch {
	case g != nil && g.rate.measured:
		rate = g.rate.at(now)
	case h.models[model] != nil:
		rate = h.models[model].perSec
	}
	n := int(rate * holdSpan.Seconds())
	if h.most > 0 {
		n = min(n, h.most)
	}
	return n
}

// excessOver is how many jobs g may have waiting before excess returns
// the rest to parking: its hold, or twice what a second of its admissions
// is, so a rate that moves by a fraction does not send jobs back and
// forth. Caller holds mu.
func (h *holds) excessOver(g *group, model string, now time.Time) int {
	return max(h.limit, 2*h.spanHold(g, model, now))
}

// countAdmission adds an admission of g to its rate and its model's.
// Caller holds mu.
func (h *holds) countAdmission(g *group, model string, now time.Time) {
	g.rate.add(now)
	mr := h.models[model]
	if mr == nil {
		mr = &admitRate{}
		h.models[model] = mr
	}
	mr.add(now)
}

// modelRate is the admissions a second of model, all groups together; 0
// while none is measured. The lower of the average and the last closed
// window: the average leaves out idle windows and moves a fifth a window,
// so after a model slows from thousands a second to a quota's few it
// stays high for a second or more, and a wait read from it would be short.
func (h *holds) modelRate(model string, now time.Time) float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	mr := h.models[model]
	if mr == nil || !mr.measured {
		return 0
	}
	return min(mr.at(now), mr.last)
}
