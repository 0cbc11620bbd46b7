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
// replica holds at most TenantHold claimed jobs of one tenant, model and
// lane waiting for admission: a further delivery of that group is parked
// (its row stays queued in Postgres with no message, and the delivery is
// acked), and the replica publishes parked rows again, oldest first, when
// the group's waiting jobs fall below half the hold. A flood therefore
// leaves the lanes at the speed the replicas read them and waits in
// Postgres, so another tenant's job that arrives behind it is in a
// dispatcher within moments, where it takes turns with the flood.

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
}

var _ Parking = (*store.Store)(nil)

// unparkGap is the least time between two unparks of one group by one
// replica: long enough for the messages of the first to have arrived and
// be counted as waiting somewhere, so replicas do not unpark a group twice
// over.
const unparkGap = 200 * time.Millisecond

// discoverEvery is how often a replica asks Postgres which groups have
// parked jobs (ones other replicas parked, or its own after a restart).
const discoverEvery = time.Second

// holds counts, per group, the claimed jobs waiting in a dispatcher and
// remembers the groups known to have parked jobs.
type holds struct {
	limit int // Config.TenantHold; 0 disables parking

	mu         sync.Mutex
	waiting    map[holdKey]int
	parked     map[holdKey]bool
	lastUnpark map[holdKey]time.Time
}

func newHolds(limit int) *holds {
	return &holds{limit: limit, waiting: map[holdKey]int{}, parked: map[holdKey]bool{}, lastUnpark: map[holdKey]time.Time{}}
}

func (h *holds) add(k holdKey, n int) {
	h.mu.Lock()
	h.waiting[k] += n
	if h.waiting[k] <= 0 {
		delete(h.waiting, k)
	}
	h.mu.Unlock()
}

// shouldPark reports whether a delivery of k is parked rather than
// claimed. A message published from parking is taken up to twice the hold,
// so a job is not parked again by the replica that did not unpark it,
// while a group can still not pile up without bound.
func (h *holds) shouldPark(k holdKey, unparked bool) bool {
	if h.limit <= 0 || k.model == "" {
		return false
	}
	limit := h.limit
	if unparked {
		limit *= 2
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waiting[k] >= limit
}

func (h *holds) markParked(k holdKey) {
	h.mu.Lock()
	h.parked[k] = true
	h.mu.Unlock()
}

// wanted returns the groups with parked jobs that have room now, and how
// many jobs each should unpark to fill its hold.
func (h *holds) wanted(now time.Time) map[holdKey]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[holdKey]int{}
	low := (h.limit + 1) / 2
	for k := range h.parked {
		n := h.waiting[k]
		if n >= low || now.Sub(h.lastUnpark[k]) < unparkGap {
			continue
		}
		out[k] = h.limit - n
		h.lastUnpark[k] = now
	}
	return out
}

// unparked records that g gave fewer jobs than asked: it is empty, as far
// as this replica knows, until a park or a discovery says otherwise.
func (h *holds) drained(k holdKey) {
	h.mu.Lock()
	delete(h.parked, k)
	delete(h.lastUnpark, k)
	h.mu.Unlock()
}

// discovered replaces what the replica knows of parked groups.
func (h *holds) discovered(gs []store.ParkedGroup) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, g := range gs {
		h.parked[holdKey{tenant: g.Tenant, model: g.Model, lane: g.Lane}] = true
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
	for i, t := range ts {
		if !parked[i] {
			w.claimer.Add(t)
			continue
		}
		w.holds.markParked(t.hold)
		w.metrics.jobs.WithLabelValues("parked").Inc()
		w.ack(t)
	}
}

// unpark publishes parked jobs of groups this replica has room for, and
// now and then asks Postgres which groups have parked jobs, until ctx ends.
func (w *Worker) unpark(ctx context.Context) {
	tick := time.NewTicker(unparkGap / 2)
	defer tick.Stop()
	var lastDiscovery time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if now.Sub(lastDiscovery) >= discoverEvery {
				lastDiscovery = now
				gs, err := w.parking.ParkedGroups(ctx)
				if err != nil {
					w.log.Warn("list parked groups", "error", err)
				}
				w.holds.discovered(gs)
			}
			for k, n := range w.holds.wanted(now) {
				w.unparkGroup(ctx, k, n)
			}
		}
	}
}

func (w *Worker) unparkGroup(ctx context.Context, k holdKey, n int) {
	keys, err := w.parking.Unpark(ctx, k.group(), n)
	if err != nil {
		w.log.Warn("unpark", "tenant", k.tenant, "model", k.model, "error", err)
		return
	}
	if len(keys) < n {
		w.holds.drained(k)
	}
	var wg sync.WaitGroup
	for _, key := range keys {
		wg.Go(func() {
			if err := w.lanes.Publish(ctx, k.lane, broker.Unparked(key, k.model)); err != nil {
				// The row is queued with no message and no longer parked:
				// the reconciler publishes it.
				w.log.Warn("publish unparked job; left to the reconciler", "job_id", key.ID, "error", err)
				if merr := w.store.MarkUnenqueued(w.bg, key); merr != nil {
					w.log.Error("mark job without message", "job_id", key.ID, "error", merr)
				}
				return
			}
			w.metrics.jobs.WithLabelValues("unparked").Inc()
		})
	}
	wg.Wait()
}
