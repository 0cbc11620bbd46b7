package worker

import (
	"context"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// Fair share across tenants (docs/design.md#tenants) works at two scales.
// Inside a replica, each model's dispatcher picks among the tenants it
// holds jobs of by weight (fairqueue.go). Across the whole backlog, a
// replica holds at most a hold of one tenant, model and lane between
// reading their messages and admitting them (TenantHold jobs, or a second
// of the group's admissions if more: holdspan.go): while it does and
// that group has jobs waiting for admission, a further delivery of the
// group is parked (its row stays queued in Postgres with no message, and
// the delivery is acked), and the replica publishes parked rows again,
// oldest first, as the group's held jobs are admitted. A flood therefore
// leaves the lanes at the speed the replicas read them and waits in
// Postgres, so another tenant's job that arrives behind it is in a
// dispatcher within moments, where it takes turns with the flood. Where
// the quota binds the hold is a small part of the prefetch, so the lanes
// keep flowing past the jobs that wait.

// holdKey names one tenant's jobs of one model and lane.
type holdKey struct {
	tenant, model string
	lane          job.Priority
}

func (k holdKey) group() store.ParkedGroup {
	return store.ParkedGroup{Tenant: k.tenant, Model: k.model, Lane: k.lane}
}

// Parking is what the worker needs from the store for parking.
type Parking interface {
	Park(ctx context.Context, keys []job.Key) ([]bool, error)
	ParkedGroups(ctx context.Context) ([]store.ParkedGroup, error)
	Unpark(ctx context.Context, g store.ParkedGroup, limit int) ([]job.Key, error)
	ParkClaimed(ctx context.Context, keys []job.Key, owner string) ([]bool, error)
	UnparkClaiming(ctx context.Context, g store.ParkedGroup, limit int, owner string, lease time.Duration) ([]store.Record, error)
	LockParked(ctx context.Context, g store.ParkedGroup, limit int, owner string, lease time.Duration) (*store.ParkedLock, error)
	SettleParked(ctx context.Context, l *store.ParkedLock, succeeded []store.ParkedSuccess, claim []job.Key) ([]bool, error)
}

var _ Parking = (*store.Store)(nil)

// unparkExpiry is how long jobs this replica unparked count as on their
// way to it: by then they have arrived here or at another replica.
const unparkExpiry = time.Second

// unsaturatedHolds is how many holds a group is filled to from parking
// while its model's admission is not the bottleneck.
const unsaturatedHolds = 8

// discoverEvery is how often a replica asks Postgres which groups have
// parked jobs (ones other replicas parked, or its own after a restart).
const discoverEvery = time.Second

// group is one holdKey's counts.
type group struct {
	held      int // messages read and not yet admitted or settled
	waiting   int // of those, claimed and waiting in a dispatcher
	parked    bool
	unparking int // unparked by this replica, not yet arrived
	unparkAt  time.Time
	rate      admitRate // the group's admissions (holdspan.go)
}

// holds counts, per group, the jobs held and remembers the groups known
// to have parked jobs.
type holds struct {
	limit int // Config.TenantHold; 0 disables parking
	most  int // Config.MaxInFlight: no group holds more (holdspan.go)
	kick  chan struct{}
	clock func() time.Time

	mu     sync.Mutex
	groups map[holdKey]*group
	models map[string]*admitRate // every group of a model together
}

func newHolds(limit int) *holds {
	return &holds{limit: limit, kick: make(chan struct{}, 1), clock: time.Now,
		groups: map[holdKey]*group{}, models: map[string]*admitRate{}}
}

func (h *holds) get(k holdKey) *group {
	g := h.groups[k]
	if g == nil {
		g = &group{}
		h.groups[k] = g
	}
	return g
}

// forget drops a group with nothing to remember.
func (h *holds) forget(k holdKey, g *group) {
	if g.held <= 0 && g.waiting <= 0 && !g.parked && g.unparking <= 0 {
		delete(h.groups, k)
	}
}

// admit decides the fate of a delivery of k: false parks it; true holds it
// (the caller claims it and calls release when it is admitted or settled).
// A group is parked only while its model's admission is the bottleneck
// (saturated: the dispatcher spends most of its time waiting for the
// governor) and the group has jobs waiting for it, so a tenant whose jobs
// are admitted as fast as they come never is. A message
// published from parking is held up to twice the hold, so a job is not
// parked again by the replica that did not unpark it, while a group can
// still not pile up without bound.
func (h *holds) admit(k holdKey, unparked, saturated bool) bool {
	if h.limit <= 0 || k.model == "" {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.get(k)
	limit := h.fill(g, k.model, true, h.clock())
	if unparked {
		limit *= 2
	}
	if unparked && g.unparking > 0 {
		g.unparking--
	}
	if saturated && g.held >= limit && g.waiting > 0 {
		h.forget(k, g)
		return false
	}
	g.held++
	return true
}

// fill is how many jobs of group g a replica takes in (from parking, or
// directly off the intake): a hold while the group's model is saturated,
// unsaturatedHolds holds while it is not, and at least what the group was
// admitted in the last holdSpan. Caller holds mu.
func (h *holds) fill(g *group, model string, saturated bool, now time.Time) int {
	base := h.limit
	if !saturated {
		base *= unsaturatedHolds
	}
	return max(base, h.spanHold(g, model, now))
}

// wake asks the unparker for a round now.
func (h *holds) wake() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// queued and dequeued track a held job entering and leaving a dispatcher;
// they, like release, are called only for a task counted by admit
// (task.holding).
func (h *holds) queued(k holdKey) {
	h.mu.Lock()
	h.get(k).waiting++
	h.mu.Unlock()
}

func (h *holds) dequeued(k holdKey) {
	h.mu.Lock()
	h.get(k).waiting--
	h.mu.Unlock()
}

// release ends a held job's hold: it was settled before its admission (a
// duplicate, a dead job, a hand-back, returned to parking) or never
// claimed. Only admitted counts toward the group's admission rate.
func (h *holds) release(k holdKey) { h.end(k, false) }

// admitted ends the hold of a job its dispatcher took for admission.
func (h *holds) admitted(k holdKey) { h.end(k, true) }

// end ends a held job's hold, counts an admission, and wakes the unparker
// when its group may have room for parked jobs: below half the fill of an
// unsaturated model, the larger one, where wanted refills it. Kicked only
// below half a hold, an unsaturated group drained from half its fill to
// empty between the unparker's ticks (100 ms, about 120 jobs at the
// side-by-side's rate) and waited there; wanted decides per model whether
// there is room. A job returned to parking counted as an admission made
// the rate, and with it the hold, grow with the very churn it caused.
func (h *holds) end(k holdKey, admission bool) {
	h.mu.Lock()
	g := h.get(k)
	g.held--
	now := h.clock()
	if admission {
		h.countAdmission(g, k.model, now)
	}
	room := g.parked && g.held+g.unparking < (h.fill(g, k.model, false, now)+1)/2
	h.forget(k, g)
	h.mu.Unlock()
	if room {
		h.wake()
	}
}

func (h *holds) markParked(k holdKey) {
	h.mu.Lock()
	h.get(k).parked = true
	h.mu.Unlock()
}

// wanted returns the groups with parked jobs that have room now, and how
// many jobs each should unpark to fill its hold, and counts them as on
// their way. A group whose model is not saturated has nothing to share:
// it is filled to unsaturatedHolds holds, so what was parked drains as
// fast as the model admits.
func (h *holds) wanted(now time.Time, saturated func(model string) bool) map[holdKey]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[holdKey]int{}
	for k, g := range h.groups {
		if !g.parked {
			continue
		}
		if g.unparking > 0 && now.Sub(g.unparkAt) >= unparkExpiry {
			g.unparking = 0
		}
		limit := h.fill(g, k.model, saturated(k.model), now)
		have := max(g.held, 0) + g.unparking
		if have >= (limit+1)/2 {
			continue
		}
		out[k] = limit - have
		g.unparking += limit - have
		g.unparkAt = now
	}
	return out
}

// excess returns the groups of saturated models that have more jobs
// waiting for admission than excessOver allows (claimed before their model
// saturated, at a start or after a pause), and how many.
func (h *holds) excess(saturated func(model string) bool) map[holdKey]int {
	h.mu.Lock()
	now := h.clock()
	var cands []holdKey
	for k, g := range h.groups {
		if g.waiting > h.excessOver(g, k.model, now) {
			cands = append(cands, k)
		}
	}
	h.mu.Unlock()
	out := map[holdKey]int{}
	for _, k := range cands {
		if !saturated(k.model) {
			continue
		}
		h.mu.Lock()
		if g := h.groups[k]; g != nil {
			if over := h.excessOver(g, k.model, now); g.waiting > over {
				out[k] = g.waiting - over
			}
		}
		h.mu.Unlock()
	}
	return out
}

// drained records that k gave fewer jobs than asked: it is empty, as far
// as this replica knows, until a park or a discovery says otherwise.
func (h *holds) drained(k holdKey) {
	h.mu.Lock()
	g := h.get(k)
	g.parked = false
	h.forget(k, g)
	h.mu.Unlock()
}

// discovered adds groups Postgres says have parked jobs.
func (h *holds) discovered(gs []store.ParkedGroup) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, g := range gs {
		h.get(holdKey{tenant: g.Tenant, model: g.Model, lane: g.Lane}).parked = true
	}
}

// parkBatch parks a batch of deliveries in one round trip; the ones whose
// job is not queued (a retry's message, a duplicate of a running job) and
// all of them when the store fails are claimed as usual instead.
func (w *Worker) parkBatch(ts []*task) {
	keys := make([]job.Key, len(ts))
	for i, t := range ts {
		keys[i] = t.key
	}
	start := time.Now()
	parked, err := w.parking.Park(w.bg, keys)
	w.metrics.storeLatency.WithLabelValues("park").Observe(time.Since(start).Seconds())
	if err != nil {
		w.log.Warn("park failed; claiming instead", "jobs", len(ts), "error", err)
		parked = make([]bool, len(ts))
	}
	// The acks go out at once: parking exists to free these prefetch slots
	// for the messages behind them.
	now := broker.AckNow(w.bg)
	for i, t := range ts {
		if !parked[i] {
			w.claimer.Add(t)
			continue
		}
		w.holds.markParked(t.hold)
		w.metrics.jobs.WithLabelValues("parked").Inc()
		w.settled(t, "ack", t.d.Ack(now))
		w.done(t, false)
	}
}

// saturated reports whether the model's admission is the bottleneck now:
// its dispatcher spent most of the last moments waiting for the governor.
func (w *Worker) saturated(model string) bool {
	w.mu.Lock()
	d := w.dispatchers[model]
	w.mu.Unlock()
	return d != nil && d.sat.saturated(time.Now())
}

// returnExcess parks up to n of the group's newest jobs waiting in its
// dispatcher: their claims are given back, their deliveries acked at once,
// so the prefetch slots they held carry other tenants' messages.
func (w *Worker) returnExcess(k holdKey, n int) {
	w.mu.Lock()
	d := w.dispatchers[k.model]
	w.mu.Unlock()
	if d == nil {
		return
	}
	ts := d.takeNewest(k.tenant, k.lane, n)
	if len(ts) == 0 {
		return
	}
	ts = w.writtenAll(ts) // a job taken write-once is parked from its row
	keys := make([]job.Key, len(ts))
	for i, t := range ts {
		keys[i] = t.key
	}
	parked, err := w.parking.ParkClaimed(w.bg, keys, w.cfg.Owner)
	if err != nil {
		w.log.Warn("return excess jobs", "tenant", k.tenant, "error", err)
		parked = make([]bool, len(ts))
	}
	now := broker.AckNow(w.bg)
	for i, t := range ts {
		if !parked[i] {
			// Still ours (or no longer): back in line.
			d.push(t)
			continue
		}
		w.holds.markParked(t.hold)
		w.metrics.jobs.WithLabelValues("parked").Inc()
		w.settled(t, "ack", t.d.Ack(now))
		w.done(t, false)
	}
}
