package quota

import (
	"time"

	"github.com/llmq/llmq/internal/ratecontrol"
)

// sample is the governor's grant counter at one round.
type sample struct {
	at      time.Time
	granted uint64
}

// measure returns this replica's demand for model (known false when there
// is nothing to go on yet: round then uses the others' typical demand):
//
//   - the DemandFunc's, when one is set;
//   - with a backlog hint (WithBacklog): the whole limit while jobs wait,
//     else the rate its governor admitted over the last interval;
//   - otherwise, from the governor's Snapshot alone: the whole limit when
//     it was busy within busyHold (admitted anything, had calls in flight
//     or waiting, admission in debt, or a draining controller), else 0, so
//     idle replicas keep the floor and busy ones split evenly. A rate-proportional
//     estimate would be finer, but a governor that admits below its share
//     for reasons of its own (calibration, a wait booked under a smaller
//     share) would then look less busy, get less, and spiral down.
func (c *Coordinator) measure(model string, cur Share, now time.Time) (d Demand, known bool) {
	if c.demand != nil {
		return c.demand(model), true
	}
	reqLim, tokLim := rates(c.models[model])
	full := Demand{Requests: reqLim, Tokens: tokLim}
	waiting := -1
	if c.backlog != nil {
		if waiting = c.backlog(model); waiting > 0 {
			return full, true
		}
	}
	snap := c.govs[model].Snapshot()
	prev, ok := c.samples[model]
	c.samples[model] = sample{at: now, granted: snap.Granted}
	dt := now.Sub(prev.at).Seconds()
	if !ok || dt <= 0 || snap.Granted == 0 || snap.Granted < prev.granted {
		return Demand{}, false
	}
	granted := snap.Granted - prev.granted
	if waiting == 0 { // told there is no backlog: wants what it admitted
		u := 0.0
		if reqLim > 0 {
			u = min(float64(granted)/dt/reqLim, 1)
		}
		return Demand{Requests: u * reqLim, Tokens: u * tokLim}, true
	}
	if granted > 0 || snap.InFlight > 0 || busy(snap) {
		c.lastBusy[model] = now
	}
	if last, ok := c.lastBusy[model]; ok && now.Sub(last) < busyHold {
		return full, true
	}
	return Demand{}, true
}

// busyHold is how long a replica counts as busy after its governor last
// looked busy. A governor can sleep for seconds on a wait it booked under a
// smaller share (ratecontrol does not re-plan waits when limits grow) and
// admit nothing meanwhile; taking that for idleness would shrink its share
// and lengthen the next wait. 30 s covers the longest such wait at the
// floor share of a typical quota; a replica idle for longer keeps only
// the floor.
const busyHold = 30 * time.Second

// busy reports a governor whose admission is in debt (a caller is booked
// ahead of the refill), whose callers wait for a concurrency slot, or whose
// controller drains (callers wait out the cooldown).
func busy(s ratecontrol.Snapshot) bool {
	if s.Waiting > 0 || (s.Controller != nil && s.Controller.State == ratecontrol.StateDrain) {
		return true
	}
	for _, level := range s.Levels {
		if level < 0 {
			return true
		}
	}
	return false
}
