package worker

import (
	"context"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/ratecontrol"
)

// dispatcher admits one model's jobs in fair order. It picks the next job
// from its fairQueue and calls Governor.Acquire for it, so the order of
// admission is the fair order; the call itself runs in its own goroutine.
// A model that is rate limited blocks only its own dispatcher.
type dispatcher struct {
	w     *Worker
	model string
	gov   *ratecontrol.Governor

	mu     sync.Mutex
	q      *fairQueue
	wake   chan struct{}
	closed bool
	// eligible passes over tenants over their own caps; nil when no tenant
	// has any.
	eligible func(tenant string) bool
}

// capRecheck is how often a dispatcher whose waiting jobs all belong to
// tenants over their caps looks again.
const capRecheck = 20 * time.Millisecond

func newDispatcher(w *Worker, model string, gov *ratecontrol.Governor) *dispatcher {
	d := &dispatcher{
		w: w, model: model, gov: gov,
		q:    newFairQueue(w.cfg.WeightHigh, w.cfg.WeightNormal, w.cfg.WeightLow),
		wake: make(chan struct{}, 1),
	}
	d.q.weight = w.limits.weight
	if w.limits.limited() {
		d.eligible = w.limits.eligible
	}
	return d
}

func (d *dispatcher) push(t *task) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		d.w.handBack(t)
		return
	}
	d.q.Push(t)
	if t.holding {
		d.w.holds.queued(t.hold)
	}
	d.w.metrics.backlog.WithLabelValues(d.model, string(t.job.Priority)).Inc()
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *dispatcher) pop() *task {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := d.q.PopEligible(d.eligible)
	if t != nil {
		if t.holding {
			d.w.holds.dequeued(t.hold)
			d.w.holds.release(t.hold)
			t.holding = false
		}
		d.w.metrics.backlog.WithLabelValues(d.model, string(t.job.Priority)).Dec()
	}
	return t
}

// waiting reports every waiting job.
func (d *dispatcher) waiting() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.q.Len()
}

// laneLen reports the waiting jobs of a lane.
func (d *dispatcher) laneLen(p job.Priority) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.q.LaneLen(p)
}

func (d *dispatcher) run(ctx context.Context) {
	defer d.shutdown()
	for {
		t := d.pop()
		if t == nil {
			var recheck <-chan time.Time
			if d.eligible != nil && d.waiting() > 0 {
				recheck = time.After(capRecheck)
			}
			select {
			case <-d.wake:
				continue
			case <-recheck:
				continue
			case <-ctx.Done():
				return
			}
		}
		permit, err := d.gov.Acquire(ctx, ratecontrol.Request{InputTokens: t.estimate, MaxTokens: t.job.MaxTokens()})
		if err != nil {
			// Only shutdown ends an Acquire: hand the job back.
			d.w.handBack(t)
			if ctx.Err() != nil {
				return
			}
			continue
		}
		d.w.limits.take(t.job.Tenant, t.estimate)
		d.w.metrics.tokensAdmit.WithLabelValues(d.model).Add(float64(t.estimate))
		d.w.calls.Add(1)
		go func() {
			defer d.w.calls.Done()
			d.w.call(t, permit)
		}()
	}
}

// shutdown hands back every job still waiting.
func (d *dispatcher) shutdown() {
	d.mu.Lock()
	d.closed = true
	waiting := d.q.Drain()
	for _, t := range waiting {
		if t.holding {
			d.w.holds.dequeued(t.hold)
		}
		d.w.metrics.backlog.WithLabelValues(d.model, string(t.job.Priority)).Dec()
	}
	d.mu.Unlock()
	for _, t := range waiting {
		d.w.handBack(t)
	}
}
