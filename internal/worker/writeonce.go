package worker

import (
	"math"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// Write-once (docs/design.md#write-once): a job the ingester reads off the
// intake while this worker has room for it may start before its row
// exists. If its call succeeds within StoreDelay of the read, the
// completion writes the row once, finished (store.InsertFinished): one
// insert instead of an insert claimed and an update, no dead row version
// for vacuum. Otherwise the row is inserted claimed when the delay is over
// (writeDue), or at once when anything else is to be recorded of the job
// (a failure, a retry, a hand-back to the store, a park: written). The
// intake message is acked only once the row is durable; until then a
// crash hands it back and the job runs again, as a job whose result could
// not be stored does. What the delay costs: the job is not visible by its
// id for up to StoreDelay after it was read, which the contract's "a row
// within about a second" allows.

// DefaultStoreDelay is Config.StoreDelay's default: long enough for a
// fast call and its batched completion, short against the second within
// which the contract promises a row.
const DefaultStoreDelay = 200 * time.Millisecond

// rowState is where the row of a job taken write-once stands.
type rowState int

const (
	rowPending rowState = iota // not written; the job runs
	rowWriting                 // an insert of it is under way
	rowWritten                 // durable: the store's transitions apply
	rowDropped                 // never written: its intake message was handed back
)

// unwritten is the row of a job taken write-once until it is written.
type unwritten struct {
	job    job.Job
	readAt time.Time
	intake broker.Delivery
	// batch is set instead of intake for a parked row locked by the
	// unparker (parklock.go): its row is written by the batch's settle,
	// and one never written stays parked.
	batch *parkedBatch
	// refused: Postgres would not store the job, which is recorded as
	// refused at intake (refuseUnstorable); its row is that record.
	refused bool

	mu    sync.Mutex
	state rowState
	// ended is closed when an insert under way ends (rowWriting left).
	ended chan struct{}
}

// take moves a pending row to rowWriting for the caller, who must end it;
// false when the row is not pending.
func (r *unwritten) take() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != rowPending {
		return false
	}
	r.state, r.ended = rowWriting, make(chan struct{})
	return true
}

// end records how an insert the caller took ended.
func (r *unwritten) end(s rowState) {
	r.mu.Lock()
	r.state = s
	close(r.ended)
	r.mu.Unlock()
}

// settledState waits for an insert under way and returns the state.
func (r *unwritten) settledState() rowState {
	r.mu.Lock()
	s, ended := r.state, r.ended
	r.mu.Unlock()
	if s != rowWriting {
		return s
	}
	<-ended
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// drop hands back the intake message of a row nobody is writing: the job
// was never recorded and runs again from its redelivery. False when the
// row is written or being written.
func (w *Worker) drop(r *unwritten) bool {
	if r.batch != nil {
		return w.batchTake(r, nil) || r.settledState() == rowDropped
	}
	if !r.take() {
		return r.settledState() == rowDropped
	}
	w.forgetUnwritten(r)
	w.handBackIntake(r)
	return true
}

// handBackIntake ends an insert the caller took of r as never written and
// hands r's intake message back.
func (w *Worker) handBackIntake(r *unwritten) {
	r.end(rowDropped)
	if err := r.intake.Nack(w.bg); err != nil {
		w.log.Warn("hand back intake message", "job_id", r.job.ID, "error", err)
	}
}

// writeNow inserts r claimed if it is pending, or waits for the insert
// under way, and returns how that ended.
func (w *Worker) writeNow(r *unwritten) rowState {
	if r.batch != nil {
		w.settleNow(r.batch)
	} else if r.take() {
		w.writeClaimed([]*unwritten{r})
	}
	return r.settledState()
}

// WritesOnce reports whether j, which Reserve took room for, may run
// before its row is written: write-once is on, j is a chat or embeddings
// job (their outcomes are all in this file's reach), no task of its key
// runs here already (a second message of the job would run it twice), and
// its model's jobs are likely to finish within the delay (quickCalls).
// Otherwise the row would only be written later than at once, after a
// probe for nothing.
func (w *Worker) WritesOnce(j job.Job) bool {
	if w.cfg.StoreDelay <= 0 {
		return false
	}
	if !writesOnceKind(j.Kind) {
		return false
	}
	key := j.Key()
	w.unwrittenMu.Lock()
	_, pending := w.unwritten[key]
	w.unwrittenMu.Unlock()
	w.mu.Lock()
	_, running := w.inflight[key]
	d := w.dispatchers[j.Model]
	w.mu.Unlock()
	if pending || running {
		return false
	}
	return w.quickCalls(d)
}

// writesOnceKind: a job of kind may run before its row is written, its
// outcomes all in this file's reach (chat and embeddings).
func writesOnceKind(kind job.Kind) bool {
	k := job.KindOf(kind)
	return k == job.KindChat || k == job.KindEmbeddings
}

// quickCalls reports whether the jobs of d's model are likely to finish
// within StoreDelay (nil d: no call yet).
func (w *Worker) quickCalls(d *dispatcher) bool { return w.quickAt(d, time.Now()) }

// quickAt is quickCalls at now: the model's calls took less than half the
// delay of late, and a job taken now waits less than that for its
// admission. A job waits nothing while the admission is not the
// bottleneck; while it is, about as long as the jobs waiting ahead of it
// take to be admitted at the model's rate. That is what tells the two
// kinds of saturation apart: where the quota binds, a dozen jobs waiting
// at 20 admissions a second are over half a second; where auto's
// concurrency binds on an instant provider, a few hundred waiting at
// thousands a second are a few dozen milliseconds: such a flood finishes
// within the delay, and storing it claimed would write every job twice.
func (w *Worker) quickAt(d *dispatcher, now time.Time) bool {
	if d == nil {
		return true
	}
	half := w.cfg.StoreDelay / 2
	if time.Duration(d.callNanos.Load()) >= half {
		return false
	}
	return !d.sat.saturated(now) || w.admissionWait(d, now) < half.Seconds()
}

// admissionWait is how many seconds the jobs waiting in d take to be
// admitted at the model's rate; infinite while the model has none
// measured. In seconds, not a Duration: a slow rate must not overflow.
func (w *Worker) admissionWait(d *dispatcher, now time.Time) float64 {
	rate := w.holds.modelRate(d.model, now)
	if rate <= 0 {
		return math.Inf(1)
	}
	return float64(d.waiting()) / rate
}

// WriteFirst writes the row of j's key now if a job of that key runs here
// unwritten, and waits for it: the ingester calls it for every job it is
// about to store, so that a second message of a job is judged against the
// first's row (a duplicate) instead of creating the row itself.
func (w *Worker) WriteFirst(j job.Job) {
	if w.cfg.StoreDelay <= 0 {
		return
	}
	w.unwrittenMu.Lock()
	r := w.unwritten[j.Key()]
	w.unwrittenMu.Unlock()
	if r == nil {
		return
	}
	w.writeNow(r)
}

// AdoptUnwritten runs rec (store.UnwrittenClaim of a job Absent found
// absent) in the room Reserve took for it; intake is its intake message,
// acked once the row is written.
func (w *Worker) AdoptUnwritten(rec store.Record, readAt time.Time, intake broker.Delivery) {
	r := &unwritten{job: rec.Job, readAt: readAt, intake: intake}
	w.unwrittenMu.Lock()
	w.unwritten[rec.Key()] = r
	w.unwrittenMu.Unlock()
	w.adoptWith(rec, "direct", r)
}

func (w *Worker) forgetUnwritten(rs ...*unwritten) {
	w.unwrittenMu.Lock()
	for _, r := range rs {
		if k := r.job.Key(); w.unwritten[k] == r {
			delete(w.unwritten, k)
		}
	}
	w.unwrittenMu.Unlock()
}

// written makes sure t's row exists before a transition other than its
// success is recorded: a row still pending is inserted claimed now. False
// when it never will be (the store could not be reached, or shutdown):
// t's intake message is handed back and t is ended.
func (w *Worker) written(t *task) bool {
	r := t.row
	if r == nil {
		return true
	}
	if w.writeNow(r) == rowWritten {
		return true
	}
	w.settled(t, "nack", t.d.Nack(w.bg))
	w.done(t, true)
	return false
}

// writtenAll is written for many tasks, their pending rows inserted in one
// statement; it returns the tasks whose rows are written, in order, and
// has ended the others.
func (w *Worker) writtenAll(ts []*task) []*task {
	var taken []*unwritten
	for _, t := range ts {
		switch r := t.row; {
		case r == nil:
		case r.batch != nil:
			w.settleNow(r.batch)
		case r.take():
			taken = append(taken, r)
		}
	}
	if len(taken) > 0 {
		w.writeClaimed(taken)
	}
	kept := ts[:0]
	for _, t := range ts {
		if w.written(t) {
			kept = append(kept, t)
		}
	}
	return kept
}

// writeDue inserts the rows pending longer than StoreDelay, and settles
// the parked batches locked that long, every quarter of it, until stop is
// closed.
func (w *Worker) writeDue(stop <-chan struct{}) {
	tick := time.NewTicker(max(w.cfg.StoreDelay/4, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			// Batches first: their row locks hold up cancels and
			// completions of their jobs, and the inserts below may retry
			// for seconds while Postgres is slow.
			w.settleDueBatches(now)
			var due []*unwritten
			w.unwrittenMu.Lock()
			for _, r := range w.unwritten {
				if r.batch == nil && now.Sub(r.readAt) >= w.cfg.StoreDelay && r.take() {
					due = append(due, r)
				}
			}
			w.unwrittenMu.Unlock()
			if len(due) > 0 {
				w.writeClaimed(due)
			}
		}
	}
}

// writeClaimed inserts rows the caller took as InsertClaiming stores a
// direct job, trying as storeResults does (tryStore), and acks the intake
// messages of those written. A key that exists meanwhile (a duplicate
// stored by another replica or the API) is not this worker's: its row
// counts as written, and the store's transitions, guarded by the lease,
// leave it alone. Rows that cannot be written are dropped.
func (w *Worker) writeClaimed(rs []*unwritten) {
	jobs := make([]job.Job, len(rs))
	claim := make([]bool, len(rs))
	for i, r := range rs {
		jobs[i], claim[i] = r.job, true
	}
	cl := store.Claiming{Claim: claim, Owner: w.cfg.Owner, Lease: w.cfg.Lease, Running: true}
	var got []store.BatchInsert
	err := w.tryStore("insert claimed", len(jobs), func() (err error) {
		got, err = w.store.InsertClaiming(w.bg, jobs, cl)
		return err
	})
	if store.Unstorable(err) {
		if rest, ok := w.refuseUnstorable(rs); ok {
			w.writeClaimed(rest)
			return
		}
	}
	w.forgetUnwritten(rs...)
	if err != nil {
		for _, r := range rs {
			w.handBackIntake(r)
		}
		return
	}
	var written, taken []*unwritten
	var holders []*job.Job
	for i, g := range got {
		if g.Claimed {
			written = append(written, rs[i])
			continue
		}
		// Its key was taken meanwhile: that row runs as stored, and this
		// task's transitions, guarded by the lease, change nothing.
		w.log.Warn("job taken write-once was stored by another", "job_id", rs[i].job.ID)
		taken, holders = append(taken, rs[i]), append(holders, &got[i].Record.Job)
	}
	w.metrics.jobs.WithLabelValues("written_claimed").Add(float64(len(written)))
	w.ackWritten(append(written, w.settleTaken(taken, holders)...))
}

// ackWritten marks rows written and acks their intake messages.
func (w *Worker) ackWritten(rs []*unwritten) {
	ds := make([]broker.Delivery, len(rs))
	for i, r := range rs {
		r.end(rowWritten)
		ds[i] = r.intake
	}
	for i, err := range broker.AckAll(w.bg, ds) {
		if err != nil {
			w.log.Warn("ack intake message", "job_id", rs[i].job.ID, "error", err)
		}
	}
}

func resultOf(c *completion) store.Result {
	return store.Result{ModelUsed: c.t.model, Response: c.resp.Body, PromptTokens: c.resp.PromptTokens,
		CompletionTokens: c.resp.CompletionTokens, Trace: c.t.trace()}
}

// storeFinished writes the rows of cs[idx], which flushCompletions took
// pending, once, finished (store.InsertFinished), sets ok or failed for
// each, and settles their rows: written (intake messages acked) or, when
// the store could not be reached, dropped (handed back). When Postgres
// refuses the batch for what one of its jobs or answers holds, the rows
// are written claimed instead (a job whose request it refuses is refused,
// writeClaimed), and it returns those whose results are still to be
// stored, as updates.
func (w *Worker) storeFinished(cs []*completion, idx []int, ok []bool, failed []error, handled []bool) (update []int) {
	items := make([]store.Finished, len(idx))
	rows := make([]*unwritten, len(idx))
	for k, i := range idx {
		r := cs[i].t.row
		rows[k] = r
		items[k] = store.Finished{Job: r.job, Owner: w.cfg.Owner, ReadAt: r.readAt, Result: resultOf(cs[i])}
	}
	var done []bool
	err := w.tryStore("insert finished", len(items), func() (err error) {
		done, err = w.store.InsertFinished(w.bg, items)
		return err
	})
	if store.Unstorable(err) {
		w.writeClaimed(rows)
		for k, i := range idx {
			switch {
			case rows[k].refused:
				// Its result is not stored: the job failed at intake.
				handled[i] = true
				w.ack(cs[i].t)
			case rows[k].settledState() == rowWritten:
				update = append(update, i)
			default:
				failed[i] = err
			}
		}
		return update
	}
	w.forgetUnwritten(rows...)
	if err != nil {
		for k, i := range idx {
			failed[i] = err
			w.handBackIntake(rows[k])
		}
		return nil
	}
	var written, taken []*unwritten
	for k, i := range idx {
		ok[i] = done[k]
		if done[k] {
			written = append(written, rows[k])
		} else {
			taken = append(taken, rows[k])
		}
	}
	w.metrics.jobs.WithLabelValues("written_once").Add(float64(len(written)))
	w.ackWritten(append(written, w.settleTaken(taken, make([]*job.Job, len(taken)))...))
	return nil
}
