package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
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
	// sat measures how much of its time the dispatcher waits for the
	// governor (tenants.go parks only while that is most of it).
	sat saturation
	// callNanos is a moving average of its calls' time from admission to
	// their outcome (writeonce.go takes jobs write-once only while that is
	// well under the store delay).
	callNanos atomic.Int64
}

// noteCall adds one call's time to callNanos (weight 1/8; the first sets it).
func (d *dispatcher) noteCall(took time.Duration) {
	old := d.callNanos.Load()
	if old == 0 {
		d.callNanos.Store(int64(took))
		return
	}
	d.callNanos.Store(old + (int64(took)-old)/8)
}

// saturation is the share of wall time a dispatcher spent blocked in
// Governor.Acquire, measured over windows of satWindow; a wait still in
// progress counts up to now, so one long wait reads as saturated at once.
type saturation struct {
	mu       sync.Mutex
	winStart time.Time
	blocked  time.Duration
	since    time.Time // start of the Acquire in progress; zero when none
	last     float64
}

// capRecheck is how often a dispatcher whose waiting jobs all belong to
// tenants over their caps looks again.
const capRecheck = 20 * time.Millisecond

const (
	satWindow = 100 * time.Millisecond
	// satShare is the share of blocked time from which admission is the
	// bottleneck: jobs wait for the quota, not for the pipeline.
	satShare = 0.5
)

func (s *saturation) begin(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.roll(now)
	s.since = now
}

// end closes the wait that begin opened. planned is when the governor
// meant to let the call go (Permit.SentAt; zero when Acquire failed): the
// wait counts up to it, not up to now, because a timer oversleeps every
// wait shorter than its resolution to about a millisecond (1.08 ms for a
// 60 µs wait on the project machine). auto no longer sleeps such waits
// (ratecontrol's timerFloor), but the classic strategies' pacers do, and a
// longer wait oversleeps too. A pacer that spaces sends 60 µs apart, far
// below its limit, would otherwise read as blocked most of the time, and a
// model whose quota is nowhere near binding would be treated as saturated
// (tenants.go: smaller holds, more and smaller unpark rounds).
func (s *saturation) end(now, planned time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if planned.IsZero() || planned.After(now) {
		planned = now
	}
	s.roll(planned)
	if d := planned.Sub(s.since); d > 0 {
		s.blocked += d
	}
	s.since = time.Time{}
	s.roll(now)
}

func (s *saturation) saturated(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.roll(now)
	return s.last >= satShare
}

// roll closes the window when it is over. Caller holds mu.
func (s *saturation) roll(now time.Time) {
	if s.winStart.IsZero() {
		s.winStart = now
		return
	}
	el := now.Sub(s.winStart)
	if el < satWindow {
		return
	}
	blocked := s.blocked
	if !s.since.IsZero() {
		blocked += now.Sub(s.since)
		s.since = now // the rest of this wait counts in the next window
	}
	s.last = min(float64(blocked)/float64(el), 1)
	s.winStart, s.blocked = now, 0
}

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
			d.w.holds.admitted(t.hold)
			t.holding = false
		}
		d.w.metrics.backlog.WithLabelValues(d.model, string(t.job.Priority)).Dec()
	}
	return t
}

// takeNewest removes up to n of the tenant's newest waiting jobs of lane.
func (d *dispatcher) takeNewest(tenant string, lane job.Priority, n int) []*task {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.q.TakeNewest(tenant, lane, n)
	for _, t := range out {
		if t.holding {
			d.w.holds.dequeued(t.hold)
		}
		d.w.metrics.backlog.WithLabelValues(d.model, string(t.job.Priority)).Dec()
	}
	return out
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
		if d.w.cancelled(t) {
			continue
		}
		asked := time.Now()
		d.sat.begin(asked)
		permit, err := d.gov.Acquire(ctx, ratecontrol.Request{InputTokens: t.booked, MaxTokens: t.maxOut})
		admitted := time.Now()
		var planned time.Time
		if err == nil {
			planned = permit.SentAt()
		}
		d.sat.end(admitted, planned)
		d.w.traceStep(t, telemetry.SpanAdmit, asked, admitted)
		if err == nil && (d.w.cancelled(t) || d.w.pastDeadline(t)) {
			// Cancelled or out of time while it waited for the quota:
			// the call never goes out.
			permit.Cancel()
			continue
		}
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
		d.w.callers.run(func() {
			defer d.w.calls.Done()
			start := time.Now()
			d.w.call(t, permit)
			d.noteCall(time.Since(start))
		})
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
	d.w.handBackAll(waiting)
}

// cancelled settles a job whose tenant cancelled it before its call went
// out, and reports whether it did.
func (w *Worker) cancelled(t *task) bool {
	w.mu.Lock()
	aborted := t.aborted
	w.mu.Unlock()
	if aborted {
		w.metrics.jobs.WithLabelValues("cancelled").Inc()
		w.ack(t) // the job is cancelled in the store already
	}
	return aborted
}

// pastDeadline dead-letters a job whose deadline passed while it waited
// for admission, and reports whether it did.
func (w *Worker) pastDeadline(t *task) bool {
	dl := t.job.Deadline
	if dl == nil || time.Now().Before(*dl) {
		return false
	}
	w.markDead(t, "deadline passed", store.AttemptError{Kind: "deadline", Model: t.model, Message: "deadline passed while waiting for the quota"})
	return true
}
