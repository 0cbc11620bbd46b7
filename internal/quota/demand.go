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

// saturatedAt is the fraction of its share a governor must admit to count
// as wanting more.
const saturatedAt = 0.8

// measure returns this replica's demand for model: from the DemandFunc when
// one is set, else the whole limit when the backlog hint (WithBacklog)
// reports waiting jobs, else from the governor's Snapshot. A saturated governor (its
// admission in debt, callers waiting for a slot, or admitting at least 80%
// of its share) wants the whole limit, so replicas under a backlog split
// evenly; otherwise it wants its admitted rate. A governor that has not
// granted anything yet, or a first round without history, gives no
// measure (known false): round uses the others' typical demand instead.
func (c *Coordinator) measure(model string, cur Share, now time.Time) (d Demand, known bool) {
	if c.demand != nil {
		return c.demand(model), true
	}
	m := c.models[model]
	reqLim, tokLim := rates(m)
	if c.backlog != nil && c.backlog(model) > 0 {
		return Demand{Requests: reqLim, Tokens: tokLim}, true
	}
	snap := c.govs[model].Snapshot()
	prev, ok := c.samples[model]
	c.samples[model] = sample{at: now, granted: snap.Granted}
	dt := now.Sub(prev.at).Seconds()
	if !ok || dt <= 0 || snap.Granted == 0 || snap.Granted < prev.granted {
		return Demand{}, false
	}
	rate := float64(snap.Granted-prev.granted) / dt
	u := 0.0 // wanted fraction of the whole limit
	switch {
	case saturated(snap):
		u = 1
	case reqLim > 0:
		u = rate / reqLim
		if cur.Requests > 0 && u >= saturatedAt*cur.Requests {
			u = 1
		}
	}
	return Demand{Requests: u * reqLim, Tokens: u * tokLim}, true
}

// saturated reports a governor whose admission is in debt (a caller is
// booked ahead of the refill) or whose callers wait for a concurrency slot.
func saturated(s ratecontrol.Snapshot) bool {
	if s.Waiting > 0 {
		return true
	}
	for _, level := range s.Levels {
		if level < 0 {
			return true
		}
	}
	return false
}
