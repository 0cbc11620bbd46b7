package worker

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
)

// Every way a task ends is here: the store transition first, then the
// delivery's settlement, then the bookkeeping (done). A delivery is acked
// only once what it led to is durable in Postgres; when the store cannot
// be reached it is handed back, and a redelivery finds the row as it is.

// ack settles a delivery whose outcome is durable (or that needs nothing).
func (w *Worker) ack(t *task) {
	w.settled(t, "ack", t.d.Ack(w.bg))
	w.done(t, false)
}

// nack hands a delivery back for immediate redelivery; nothing was recorded.
func (w *Worker) nack(t *task) {
	w.settled(t, "nack", t.d.Nack(w.bg))
	w.done(t, true)
}

// retryLater has the broker deliver the message again after delay, holding
// no consumer meanwhile. When that publish fails the broker has the
// delivery back at once; a retrying job is then marked as having no
// message, so its redelivery is dropped and the reconciler publishes one
// when it is due, instead of the message cycling through the lane.
func (w *Worker) retryLater(t *task, delay time.Duration) {
	err := t.d.Retry(w.bg, delay, nil)
	if errors.Is(err, broker.ErrHandedBack) {
		w.metrics.jobs.WithLabelValues("retry_publish_failed").Inc()
		if t.rec.Status == job.StatusRetrying {
			if merr := w.store.MarkUnenqueued(w.bg, t.key); merr != nil {
				w.log.Error("mark job without message", "job_id", t.key.ID, "error", merr)
			}
		}
	}
	w.settled(t, "retry", err)
	w.done(t, false)
}

// handBack returns a claimed job that was not (fully) attempted: the
// attempt is released in the store and the message redelivered.
func (w *Worker) handBack(t *task) {
	if t.row != nil && w.drop(t.row) {
		// Never written: its intake message comes back instead.
		w.nack(t)
		return
	}
	if _, err := w.store.Release(w.bg, t.key, w.cfg.Owner); err != nil {
		w.log.Error("release job", "job_id", t.key.ID, "error", err)
	}
	w.nack(t)
}

// handBackAll is handBack for the jobs a stopping dispatcher had waiting,
// together: their claims are released a statement per releaseChunk, and
// the rest, which waits on the broker (a write-once job's intake message
// handed back, a direct job's wake-up published with its confirm), runs on
// handBackParallel goroutines. The shutdown grace of the calls in flight
// starts only once they are back.
func (w *Worker) handBackAll(ts []*task) {
	dropped := make([]bool, len(ts))
	inParallel(len(ts), func(i int) {
		// Never written: its intake message comes back instead.
		dropped[i] = ts[i].row != nil && w.drop(ts[i].row)
	})
	keys := make([]job.Key, 0, len(ts))
	for i, t := range ts {
		if !dropped[i] {
			keys = append(keys, t.key)
		}
	}
	for chunk := range slices.Chunk(keys, releaseChunk) {
		if _, err := w.store.ReleaseBatch(w.bg, chunk, w.cfg.Owner); err != nil {
			// As handBack: the lease expires and the message comes back.
			w.log.Error("release jobs", "jobs", len(chunk), "error", err)
		}
	}
	inParallel(len(ts), func(i int) { w.nack(ts[i]) })
}

// inParallel calls fn for each of 0..n-1 from up to handBackParallel
// goroutines and returns when all calls have.
func inParallel(n int, fn func(i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(handBackParallel, n) {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

const (
	// releaseChunk bounds the keys of one release statement.
	releaseChunk = 1000
	// handBackParallel is how many hand-backs wait on the broker at once.
	handBackParallel = 16
)

// held is the attempt this worker holds on t's job, which the store
// methods that end it name.
func (w *Worker) held(t *task) store.Attempt {
	return store.Attempt{Key: t.key, Owner: w.cfg.Owner, N: t.attempt}
}

// transitioned settles the delivery when a store transition that ends an
// attempt did not take effect, and reports whether it did. A store error
// hands the message back (nothing was recorded); a lost claim (lease taken
// over, job cancelled) acks it, since the new owner has its own delivery.
func (w *Worker) transitioned(t *task, op string, ok bool, err error) bool {
	if err != nil {
		w.log.Error(op, "job_id", t.key.ID, "error", err)
		w.nack(t)
		return false
	}
	if !ok {
		w.ack(t)
		return false
	}
	return true
}

// failPermanently ends the attempt as failed (a 4xx, a model no longer
// configured) and acks.
func (w *Worker) failPermanently(t *task, ae store.AttemptError) {
	if !w.written(t) {
		return
	}
	ae.Trace = t.trace()
	ok, err := w.store.Fail(w.bg, w.held(t), ae)
	if !w.transitioned(t, "store permanent failure", ok, err) {
		return
	}
	w.metrics.jobs.WithLabelValues("failed").Inc()
	w.traceOutcome(t, "failed")
	w.log.Info("job failed permanently", "job_id", t.key.ID, "tenant", t.key.Tenant, "model", ae.Model, "kind", ae.Kind, "code", ae.Code)
	w.ack(t)
}

// markDead ends the running attempt as dead and records the job's dead
// letter in the same transaction, then acks.
func (w *Worker) markDead(t *task, reason string, ae store.AttemptError) {
	if !w.written(t) {
		return
	}
	if ae.At.IsZero() {
		ae.At = time.Now()
	}
	if ae.Attempt == 0 {
		ae.Attempt = t.attempt
	}
	ae.Trace = t.trace()
	errs := append(append([]store.AttemptError(nil), t.rec.Errors...), ae)
	ok, err := w.store.MarkDeadLettered(w.bg, w.held(t), ae, w.deadLetterRow(t, reason, errs, ae))
	if !w.transitioned(t, "mark dead", ok, err) {
		return
	}
	w.deadLettered(t, reason)
}

func (w *Worker) deadLettered(t *task, reason string) {
	w.metrics.jobs.WithLabelValues("dead").Inc()
	w.traceOutcome(t, "dead")
	w.metrics.deadLetters.WithLabelValues(deadReason(reason)).Inc()
	w.log.Warn("job dead-lettered", "job_id", t.key.ID, "tenant", t.key.Tenant, "reason", reason, "attempts", max(t.attempt, len(t.rec.Errors)))
	w.ack(t)
}

// deadLetterRow is the dead letter of a job (store.JobDeadLetter), with
// the message as read for its body when the job cannot be encoded.
func (w *Worker) deadLetterRow(t *task, reason string, errs []store.AttemptError, last store.AttemptError) store.DeadLetterRow {
	dl := store.JobDeadLetter(t.job, t.attempt, reason, errs, last)
	dl.Tenant, dl.JobID = t.key.Tenant, t.key.ID
	if dl.Body == nil {
		dl.Body = t.d.Message().Body
	}
	return dl
}

func deadReason(reason string) string {
	switch {
	case reason == "deadline passed":
		return reason
	case strings.HasPrefix(reason, store.ReasonExhausted):
		return store.ReasonExhausted
	}
	return "other"
}

// flushCompletions stores a batch of results, then acks the deliveries
// together (broker.AckAll: one frame for a run of them where the broker
// allows it). A job taken write-once whose row is still pending is written
// here once, finished (writeonce.go), or at its parked batch's settle
// (parklock.go); the others' rows are updated.
func (w *Worker) flushCompletions(cs []*completion) {
	var updates, inserts []int
	handled := make([]bool, len(cs)) // settled before the writes
	for i, c := range cs {
		switch r := c.t.row; {
		case r == nil:
			updates = append(updates, i)
		case r.batch != nil && w.batchTake(r, c):
			// Written at its batch's settle, which settles its delivery.
			handled[i] = true
		case r.batch == nil && r.take():
			inserts = append(inserts, i)
		case r.settledState() == rowWritten:
			updates = append(updates, i)
		default:
			// Never written (the writer gave up): the intake message is
			// back with the broker, or the row parked, and the job runs
			// again from it.
			w.settled(c.t, "nack", c.t.d.Nack(w.bg))
			w.done(c.t, false)
			handled[i] = true
		}
	}
	ok := make([]bool, len(cs))
	failed := make([]error, len(cs))
	start := time.Now()
	if len(inserts) > 0 {
		// Rows Postgres refused to write finished are written claimed
		// (or refused) by then, and their results go with the updates.
		updates = append(updates, w.storeFinished(cs, inserts, ok, failed, handled)...)
	}
	if len(updates) > 0 {
		w.storeUpdates(cs, updates, ok, failed, handled)
	}
	end := time.Now()
	w.metrics.storeLatency.WithLabelValues("complete_batch").Observe(end.Sub(start).Seconds())
	w.settleUnhandled(cs, ok, failed, handled, start, end)
}

// settleUnhandled is settleCompletions of the completions not handled
// (settled already) of cs.
func (w *Worker) settleUnhandled(cs []*completion, ok []bool, failed []error, handled []bool, start, end time.Time) {
	var rest []*completion
	var restOK []bool
	var restFailed []error
	for i, c := range cs {
		if !handled[i] {
			rest, restOK, restFailed = append(rest, c), append(restOK, ok[i]), append(restFailed, failed[i])
		}
	}
	w.settleCompletions(rest, restOK, restFailed, start, end)
}

// settleCompletions settles the deliveries of completions whose results
// were written between start and end: acked when stored (ok: the row took
// the result; not ok: the claim was lost meanwhile), handed back when the
// write failed.
func (w *Worker) settleCompletions(cs []*completion, ok []bool, failed []error, start, end time.Time) {
	var acked []*completion
	var okAcked []bool
	for i, c := range cs {
		w.traceStep(c.t, telemetry.SpanComplete, start, end)
		if failed[i] != nil {
			// The call succeeded but the result could not be stored, even
			// after storeResults' tries: the message comes back and the job
			// runs again once its lease expires (or, never written, from its
			// intake message or its parked row).
			w.log.Error("store result", "job_id", c.t.key.ID, "error", failed[i])
			w.settled(c.t, "nack", c.t.d.Nack(w.bg))
			w.done(c.t, false)
			continue
		}
		acked, okAcked = append(acked, c), append(okAcked, ok[i])
	}
	if len(acked) == 0 {
		return
	}
	w.failpoint(FailpointAfterResultWrite)
	if w.onDone != nil {
		w.onDone()
	}
	ds := make([]broker.Delivery, len(acked))
	for i, c := range acked {
		ds[i] = c.t.d
		if okAcked[i] {
			w.metrics.jobs.WithLabelValues("succeeded").Inc()
			w.traceOutcome(c.t, "succeeded")
			w.metrics.latency.WithLabelValues(c.t.model).Observe(time.Since(c.t.received).Seconds())
		} else {
			// Lease lost meanwhile (cancelled or taken over), or, written
			// once, a duplicate stored the job first: result dropped.
			w.metrics.jobs.WithLabelValues("lease_lost").Inc()
			w.traceOutcome(c.t, "lease_lost")
		}
	}
	for i, err := range broker.AckAll(w.bg, ds) {
		w.settled(acked[i].t, "ack", err)
		w.done(acked[i].t, false)
	}
}

// completeTries is how often tryStore tries a write; it waits 50 ms, then
// four times longer, between tries.
const completeTries = 4

// storeResults stores a batch of results the provider was paid for. A
// result that cannot be stored is paid for again (its job runs again once
// its lease expires), so a transient failure, a deadlock Postgres broke by
// aborting this statement or a moment's outage, is worth a second or so of
// waiting. CompleteBatch is one statement and guarded by the attempt, so
// a try whose commit went through unseen makes the next one store nothing.
func (w *Worker) storeResults(items []store.Completion) (ok []bool, err error) {
	err = w.tryStore("store results", len(items), func() (err error) {
		ok, err = w.store.CompleteBatch(w.bg, items)
		return err
	})
	return ok, err
}

// tryStore runs op, a write of n jobs, up to completeTries times (see
// storeResults for why a write is worth that wait).
func (w *Worker) tryStore(what string, n int, op func() error) error {
	wait := 50 * time.Millisecond
	for try := 1; ; try++ {
		err := op()
		if err == nil || try == completeTries || store.Unstorable(err) {
			// Postgres refused the values, and would again: the caller
			// splits the write (unstorable.go).
			return err
		}
		w.metrics.storeRetries.Inc()
		w.log.Warn(what+"; trying again", "jobs", n, "try", try, "error", err)
		time.Sleep(wait)
		wait *= 4
	}
}

// settled logs a settlement that did not go through as asked (the broker
// then has the message back, or it was settled already).
func (w *Worker) settled(t *task, op string, err error) {
	if err != nil {
		w.log.Warn("settle delivery", "op", op, "job_id", t.key.ID, "error", err)
	}
}

// done settles the bookkeeping of a task whose delivery has been settled.
func (w *Worker) done(t *task, handedBack bool) {
	if t.row != nil {
		// Ended with nothing recorded and its row never written: the
		// intake message comes back (a no-op once the row is written).
		w.drop(t.row)
	}
	if t.holding {
		// Settled before it was admitted (a duplicate, a dead job, a
		// hand-back): its hold ends here.
		w.holds.release(t.hold)
		t.holding = false
	}
	w.mu.Lock()
	if cur, ok := w.inflight[t.key]; ok && cur == t {
		delete(w.inflight, t.key)
	}
	if w.stopping {
		if handedBack {
			w.handedBack++
		} else {
			w.finishedAfterStop++
		}
	}
	w.mu.Unlock()
	w.endTrace(t)
	<-w.slots
	w.tasks.Done()
}
