package worker

import (
	"context"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
)

// unpark brings back parked jobs of groups this replica has room for
// (woken as held jobs are admitted), and now and then asks Postgres which
// groups have parked jobs, until ctx ends.
func (w *Worker) unpark(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var lastDiscovery time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.holds.kick:
		case now := <-tick.C:
			if now.Sub(lastDiscovery) >= discoverEvery {
				lastDiscovery = now
				gs, err := w.parking.ParkedGroups(ctx)
				if err != nil {
					w.log.Warn("list parked groups", "error", err)
				}
				w.holds.discovered(gs)
			}
		}
		for k, n := range w.holds.wanted(time.Now(), w.saturated) {
			if w.direct != nil {
				w.unparkHere(ctx, k, n)
			} else {
				w.unparkGroup(ctx, k, n)
			}
		}
		for k, n := range w.holds.excess(w.saturated) {
			w.returnExcess(k, n)
		}
	}
}

// unparkHere runs up to n parked jobs of k in this worker, as many as it
// has room for: they are claimed in the statement that unparks them
// (store.UnparkClaiming) and adopted like jobs of the direct intake, so an
// unparked job costs one UPDATE instead of a publish, a delivery and a
// claim. Used with the direct intake on; with worker.lanes_only every job
// goes through a lane, unparked ones too (unparkGroup).
func (w *Worker) unparkHere(ctx context.Context, k holdKey, n int) {
	room := w.takeRoom(n)
	if room == 0 {
		w.holds.adopted(k, 0, n)
		return
	}
	recs, err := w.parking.UnparkClaiming(ctx, k.group(), room, w.cfg.Owner, w.cfg.Lease)
	if err != nil {
		w.log.Warn("unpark", "tenant", k.tenant, "model", k.model, "error", err)
		recs = nil
	}
	if err == nil && len(recs) < room {
		w.holds.drained(k)
	}
	w.holds.adopted(k, len(recs), n)
	for range room - len(recs) {
		w.giveBackRoom()
	}
	for _, rec := range recs {
		w.adopt(rec, "unparked")
	}
}

// takeRoom takes up to n MaxInFlight slots without waiting, none while
// the worker is not accepting; each must be used by adopt or given back by
// giveBackRoom.
func (w *Worker) takeRoom(n int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.accepting {
		return 0
	}
	got := 0
	for ; got < n; got++ {
		select {
		case w.slots <- struct{}{}:
			continue
		default:
		}
		break
	}
	w.tasks.Add(got)
	w.adopting.Add(got)
	return got
}

// adopted counts the got jobs of k that this replica unparked and runs
// itself as held, and the n it had asked for as no longer on their way.
func (h *holds) adopted(k holdKey, got, n int) {
	h.mu.Lock()
	g := h.get(k)
	g.held += got
	g.unparking = max(g.unparking-n, 0)
	h.forget(k, g)
	h.mu.Unlock()
}

// unparkGroup publishes up to n parked jobs of k on their lane, for any
// replica to claim.
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
