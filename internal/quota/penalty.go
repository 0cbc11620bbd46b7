package quota

import (
	"context"
	"time"

	"github.com/llmq/llmq/internal/ratecontrol"
)

// penalty is a 429 one replica saw, shared through quota_penalties.
type penalty struct {
	seq        int64
	model      string
	kind       string
	code       string
	retryAfter time.Duration
	at         time.Time // when its insert began (Postgres's clock)
	read       time.Time // when the round that read it began (the same clock)
}

// kinds maps Kind names back to Kinds.
var kinds = func() map[string]ratecontrol.Kind {
	m := map[string]ratecontrol.Kind{}
	for k := ratecontrol.Kind(0); k < 64; k++ {
		if s := k.String(); s != "unknown" {
			m[s] = k
		}
	}
	return m
}()

// Report429 shares a 429 this replica's governor saw on model with the
// other replicas: it is written to Postgres at once (by the Run goroutine)
// and every other replica's governor is penalized in its next round. It
// never blocks; other outcomes are ignored. Provider messages are not
// shared, only the kind, the code and Retry-After.
func (c *Coordinator) Report429(model string, cl ratecontrol.Classification) {
	if !cl.Kind.RateLimited() {
		return
	}
	if _, ok := c.models[model]; !ok {
		return
	}
	c.pmu.Lock()
	if len(c.pending) >= maxPending {
		c.pending = c.pending[1:]
		c.met.penalties.WithLabelValues("dropped").Inc()
	}
	c.pending = append(c.pending, penalty{model: model, kind: cl.Kind.String(), code: cl.Code, retryAfter: cl.RetryAfter})
	c.pmu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// flushPenalties writes the pending penalties in one statement. Penalties
// are advisory: on failure they are dropped and counted.
func (c *Coordinator) flushPenalties(ctx context.Context) {
	c.pmu.Lock()
	pend := c.pending
	c.pending = nil
	c.pmu.Unlock()
	if len(pend) == 0 {
		return
	}
	models, kinds, codes := make([]string, len(pend)), make([]string, len(pend)), make([]string, len(pend))
	retry := make([]int64, len(pend))
	for i, p := range pend {
		models[i], kinds[i], codes[i], retry[i] = p.model, p.kind, p.code, p.retryAfter.Milliseconds()
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	_, err := c.pool.Exec(ctx, `INSERT INTO quota_penalties (model, replica_id, kind, code, retry_after_ms)
		SELECT u.model, $1, u.kind, u.code, u.ms FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[]) AS u(model, kind, code, ms)`,
		c.id, models, kinds, codes, retry)
	if err != nil {
		c.met.penalties.WithLabelValues("dropped").Add(float64(len(pend)))
		c.log.Debug("quota: share 429 penalties", "replica_id", c.id, "count", len(pend), "error", err)
		return
	}
	c.met.penalties.WithLabelValues("sent").Add(float64(len(pend)))
}

// applyPenalties feeds other replicas' 429s to the governors: one Penalize
// per model and round (the latest kind, the longest Retry-After), since the
// controller cuts once per cooldown anyway. A penalty read again in the
// late window (lateWindow) is applied once; the first round's are history.
func (c *Coordinator) applyPenalties(pens []penalty, firstRound bool) {
	c.lastSeq = max(c.lastSeq, 0)
	var fresh []penalty
	for _, p := range pens {
		c.lastSeq = max(c.lastSeq, p.seq)
		if _, seen := c.seenPens[p.seq]; !seen {
			c.seenPens[p.seq] = p.at
			fresh = append(fresh, p)
		}
	}
	if len(pens) > 0 {
		// Out of the window by the clock that reads it, a penalty seen is
		// below lastSeq and never read again.
		cut := pens[0].read.Add(-2 * c.lateWindow)
		for seq, at := range c.seenPens {
			if at.Before(cut) {
				delete(c.seenPens, seq)
			}
		}
	}
	if firstRound {
		return
	}
	perModel := map[string]ratecontrol.Classification{}
	for _, p := range fresh {
		k, ok := kinds[p.kind]
		if !ok || !k.RateLimited() {
			continue
		}
		cl := perModel[p.model]
		cl.Kind, cl.Status = k, 429
		if p.code != "" {
			cl.Code = p.code
		}
		cl.RetryAfter = max(cl.RetryAfter, p.retryAfter)
		perModel[p.model] = cl
	}
	for model, cl := range perModel {
		if g, ok := c.govs[model]; ok {
			g.Penalize(cl)
		}
	}
	c.met.penalties.WithLabelValues("received").Add(float64(len(fresh)))
}
