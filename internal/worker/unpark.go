package worker

import (
	"context"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/store"
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
// has room for, adopted like jobs of the direct intake: locked in batches
// to be written once while their calls are quick (parklock.go), otherwise
// claimed in the statement that unparks them (store.UnparkClaiming). An
// unparked job costs no UPDATE of its own, or one, instead of a publish, a
// delivery and a claim. Used with the direct intake on; with
// worker.lanes_only every job goes through a lane, unparked ones too
// (unparkGroup).
func (w *Worker) unparkHere(ctx context.Context, k holdKey, n int) {
	room := w.takeRoom(n)
	if room == 0 {
		w.holds.adopted(k, 0, n)
		return
	}
	recs, rows, drained, full, err := w.lockBatches(ctx, k, room)
	if err == nil && !drained && !full && len(recs) < room {
		var claimed []store.Record
		claimed, err = w.parking.UnparkClaiming(ctx, k.group(), room-len(recs), w.cfg.Owner, w.cfg.Lease)
		recs = append(recs, claimed...)
		drained = err == nil && len(recs) < room
	}
	if err != nil {
		w.log.Warn("unpark", "tenant", k.tenant, "model", k.model, "error", err)
	}
	if drained {
		w.holds.drained(k)
	}
	w.holds.adopted(k, len(recs), n)
	for range room - len(recs) {
		w.giveBackRoom()
	}
	for i, rec := range recs {
		var row *unwritten
		if i < len(rows) {
			row = rows[i]
		}
		w.adoptWith(rec, "unparked", row)
	}
}

// lockBatches locks up to room parked jobs of k in batches of at most
// parkedBatchSize while locksParked allows, and returns them with their
// rows (nil for a job claimed already), whether k has no more, and
// whether it stopped at maxParkedLocks: the rest then waits for a batch to
// settle, which with quick calls is soon, rather than take the claim's
// extra write. Several small batches, not one large one, because a
// batch's jobs hold their room until its last one ends.
func (w *Worker) lockBatches(ctx context.Context, k holdKey, room int) (recs []store.Record, rows []*unwritten, drained, full bool, err error) {
	for len(recs) < room {
		ok, atCap := w.locksParked(k.model)
		if !ok {
			return recs, rows, false, atCap, nil
		}
		want := min(room-len(recs), parkedBatchSize)
		got, gotRows, err := w.lockParked(ctx, k, want)
		if err != nil {
			return recs, rows, false, false, err
		}
		if gotRows == nil {
			gotRows = make([]*unwritten, len(got))
		}
		recs, rows = append(recs, got...), append(rows, gotRows...)
		if len(got) < want {
			return recs, rows, true, false, nil
		}
	}
	return recs, rows, false, false, nil
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
