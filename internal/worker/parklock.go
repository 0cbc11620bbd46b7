package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// Write-once for parked jobs (docs/design.md#write-once): the unparker
// locks a batch of a group's parked rows in an open transaction
// (store.LockParked) instead of claiming them, and runs them. A job that
// succeeds is written once, finished, when the batch settles; the batch
// settles in one statement or two and a commit when every row is
// accounted for, when StoreDelay has passed since the lock, or when one of
// its jobs needs its row written for another outcome (then every row not
// finished yet is claimed in the same commit, and runs on as any claimed
// job). A job that ends with nothing recorded stays parked, as does every
// row of a batch whose settle fails: the transaction rolls back, as a
// crash would roll it back.

// maxParkedLocks bounds the batches a worker holds locked at once: each
// holds a pool connection (of the consumer's 16) for up to StoreDelay.
// parkedBatchSize bounds a batch. Together they bound the jobs a replica
// runs locked; 4 of 128 ran the backlog benchmark fastest of the shapes
// tried (BENCHMARKS.md, "Parked jobs written once").
const (
	maxParkedLocks  = 4
	parkedBatchSize = 128
)

// parkedBatch is one store.ParkedLock the worker runs.
type parkedBatch struct {
	lock     *store.ParkedLock
	lockedAt time.Time

	mu        sync.Mutex
	rows      []*unwritten
	succeeded []*completion // taken by flushCompletions, written at the settle
	settling  bool
}

// locksParked reports whether the unparker may lock the parked jobs of
// model's group instead of claiming them: write-once is on, its calls are
// quick (WritesOnce's rule) and fewer than maxParkedLocks batches are
// open; full reports that the last is all that stands in the way.
func (w *Worker) locksParked(model string) (ok, full bool) {
	if w.cfg.StoreDelay <= 0 {
		return false, false
	}
	w.mu.Lock()
	d := w.dispatchers[model]
	w.mu.Unlock()
	if !w.quickCalls(d) {
		return false, false
	}
	w.unwrittenMu.Lock()
	defer w.unwrittenMu.Unlock()
	full = len(w.parkedBatches) >= maxParkedLocks
	return !full, full
}

// lockParked locks up to room parked jobs of k (store.LockParked) and
// returns them as records to adopt, with their rows (nil when they are
// claimed already), or nothing when k has none left. A batch holding a job
// that write-once cannot take (a kind whose outcomes write outside its
// reach) is settled at once, every row claimed, as UnparkClaiming would.
func (w *Worker) lockParked(ctx context.Context, k holdKey, room int) ([]store.Record, []*unwritten, error) {
	l, err := w.parking.LockParked(ctx, k.group(), room, w.cfg.Owner, w.cfg.Lease)
	if err != nil || l == nil {
		return nil, nil, err
	}
	recs := l.Records()
	for _, rec := range recs {
		if !writesOnceKind(rec.Kind) {
			keys := make([]job.Key, len(recs))
			for i, rec := range recs {
				keys[i] = rec.Key()
			}
			if _, err := w.parking.SettleParked(w.bg, l, nil, keys); err != nil {
				return nil, nil, err
			}
			return recs, nil, nil
		}
	}
	now := time.Now()
	b := &parkedBatch{lock: l, lockedAt: now, rows: make([]*unwritten, len(recs))}
	for i, rec := range recs {
		b.rows[i] = &unwritten{job: rec.Job, readAt: now, batch: b}
	}
	w.unwrittenMu.Lock()
	for _, r := range b.rows {
		w.unwritten[r.job.Key()] = r
	}
	w.parkedBatches[b] = struct{}{}
	w.unwrittenMu.Unlock()
	return recs, b.rows, nil
}

// batchTake takes r, a row of a parked batch, for how it ended: with c
// (succeeded, written at the settle), or with nothing to record (c nil:
// the row stays parked). False when r is not pending; the caller then
// waits for its state. The batch settles when r was its last pending row.
// A batch's rows are taken only under its mutex, here and in settleNow.
func (w *Worker) batchTake(r *unwritten, c *completion) bool {
	b := r.batch
	b.mu.Lock()
	if b.settling || !r.take() {
		b.mu.Unlock()
		return false
	}
	if c != nil {
		b.succeeded = append(b.succeeded, c)
	} else {
		r.end(rowDropped) // left parked: the settle does not name it
	}
	last := !b.anyPending()
	if last {
		b.settling = true
	}
	b.mu.Unlock()
	if last {
		w.settleBatch(b, nil)
	}
	return true
}

// anyPending reports whether a row of b is pending; b.mu is held.
func (b *parkedBatch) anyPending() bool {
	for _, r := range b.rows {
		r.mu.Lock()
		s := r.state
		r.mu.Unlock()
		if s == rowPending {
			return true
		}
	}
	return false
}

// settleNow settles b at once, every row still pending claimed; when b
// is settling already it leaves that settle to end the rows.
func (w *Worker) settleNow(b *parkedBatch) {
	b.mu.Lock()
	if b.settling {
		b.mu.Unlock()
		return
	}
	b.settling = true
	var claim []*unwritten
	for _, r := range b.rows {
		if r.take() {
			claim = append(claim, r)
		}
	}
	b.mu.Unlock()
	w.settleBatch(b, claim)
}

// settleBatch writes b's succeeded jobs finished and claims claim's rows in
// one commit, then ends every row: written, or dropped (left parked) for
// those in neither and for all when the settle failed. The succeeded
// jobs' deliveries are then settled as flushCompletions settles its own.
func (w *Worker) settleBatch(b *parkedBatch, claim []*unwritten) {
	items := make([]store.ParkedSuccess, len(b.succeeded))
	for i, c := range b.succeeded {
		items[i] = store.ParkedSuccess{Key: c.t.key, Result: resultOf(c)}
	}
	keys := make([]job.Key, len(claim))
	for i, r := range claim {
		keys[i] = r.job.Key()
	}
	start := time.Now()
	ok, err := w.parking.SettleParked(w.bg, b.lock, items, keys)
	end := time.Now()
	w.unwrittenMu.Lock()
	delete(w.parkedBatches, b)
	w.unwrittenMu.Unlock()
	w.holds.wake() // a lock is free: the unparker may take the next batch
	w.forgetUnwritten(b.rows...)
	var refused *store.AnswersRefused
	if errors.As(err, &refused) {
		w.settleRefused(b, claim, refused, start)
		return
	}
	failed := make([]error, len(b.succeeded))
	if err != nil {
		w.log.Warn("settle locked parked jobs; they stay parked", "jobs", len(items)+len(keys), "error", err)
		for i := range failed {
			failed[i] = err
		}
	}
	if ok == nil {
		ok = make([]bool, len(items))
	}
	if err == nil {
		b.endWriting(rowWritten)
	} else {
		b.endWriting(rowDropped)
	}
	if err == nil {
		w.metrics.jobs.WithLabelValues("written_once").Add(float64(len(items)))
		w.metrics.jobs.WithLabelValues("written_claimed").Add(float64(len(keys)))
	}
	if len(b.succeeded) > 0 {
		w.metrics.storeLatency.WithLabelValues("complete_batch").Observe(end.Sub(start).Seconds())
		w.settleCompletions(b.succeeded, ok, failed, start, end)
	}
}

// endWriting ends, as s, the rows of b taken for its settle (rowWriting);
// the others were ended before.
func (b *parkedBatch) endWriting(s rowState) {
	for _, r := range b.rows {
		r.mu.Lock()
		writing := r.state == rowWriting
		r.mu.Unlock()
		if writing {
			r.end(s)
		}
	}
}

// settleDueBatches settles the batches locked longer than StoreDelay.
func (w *Worker) settleDueBatches(now time.Time) {
	var due []*parkedBatch
	w.unwrittenMu.Lock()
	for b := range w.parkedBatches {
		if now.Sub(b.lockedAt) >= w.cfg.StoreDelay {
			due = append(due, b)
		}
	}
	w.unwrittenMu.Unlock()
	for _, b := range due {
		w.settleNow(b)
	}
}
