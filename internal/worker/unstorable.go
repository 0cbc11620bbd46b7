package worker

import (
	"time"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// A write Postgres refuses for what one job or answer holds
// (store.Unstorable: a value nested deeper than the server's stack allows,
// or a rule of a later Postgres) fails at every try, and with it every
// other job of the statement, each of which would be paid for again. Such
// a write is split instead: a request Postgres refuses fails its job as at
// intake, an answer it refuses fails its job with that reason, and the
// rest are stored.

// refuseUnstorable records the jobs of rs, rows taken for writeClaimed,
// whose requests Postgres refuses on their own (store.UnstorableJobs) as
// refused at intake (store.RecordIntakeFailure: failed under their id
// with Postgres's reason, the intake message kept as the dead letter),
// acks their intake messages and returns the other rows. ok is false when
// no job is refused on its own, or the probe failed: the caller writes rs
// as it would have.
func (w *Worker) refuseUnstorable(rs []*unwritten) (rest []*unwritten, ok bool) {
	jobs := make([]job.Job, len(rs))
	for i, r := range rs {
		jobs[i] = r.job
	}
	errs, err := w.store.UnstorableJobs(w.bg, jobs)
	if err != nil {
		w.log.Warn("find the job Postgres refuses", "jobs", len(jobs), "error", err)
		return nil, false
	}
	for i, e := range errs {
		r := rs[i]
		if e == nil {
			rest = append(rest, r)
			continue
		}
		j := r.job
		f := store.RefusedJob(j, r.intake.Message().Body, e)
		w.forgetUnwritten(r)
		if _, err := w.store.RecordIntakeFailure(w.bg, f); err != nil {
			w.log.Error("record a job Postgres refuses", "job_id", j.ID, "error", err)
			w.handBackIntake(r)
			continue
		}
		// The refusal's row is the job's: its task's transitions, guarded
		// by its lease, change nothing.
		r.refused = true
		r.end(rowWritten)
		if err := r.intake.Ack(w.bg); err != nil {
			w.log.Warn("ack intake message", "job_id", j.ID, "error", err)
		}
		w.metrics.jobs.WithLabelValues("refused").Inc()
		w.log.Warn("job refused: Postgres will not store it", "job_id", j.ID, "tenant", j.Tenant, "reason", f.Reason)
		// Written at the store delay, its call may still be under way or
		// not yet made: it is stopped, as a cancelled job's is.
		w.Abort(j.Key())
	}
	return rest, len(rest) < len(rs)
}

// storeUpdates stores the results of cs[idx], whose rows are written, in
// one CompleteBatch and sets ok or failed for each. When Postgres refuses
// the batch for its values, each result is stored on its own, and a job
// whose answer it refuses fails permanently with the reason (handled: it
// is settled here).
func (w *Worker) storeUpdates(cs []*completion, idx []int, ok []bool, failed []error, handled []bool) {
	items := make([]store.Completion, len(idx))
	for k, i := range idx {
		items[k] = store.Completion{Attempt: w.held(cs[i].t), Result: resultOf(cs[i])}
	}
	done, err := w.storeResults(items)
	if !store.Unstorable(err) {
		for k, i := range idx {
			if err != nil {
				failed[i] = err
			} else {
				ok[i] = done[k]
			}
		}
		return
	}
	for k, i := range idx {
		done, err := w.storeResults(items[k : k+1])
		switch {
		case err == nil:
			ok[i] = done[0]
		case store.Unstorable(err):
			handled[i] = true
			t := cs[i].t
			// The call was made and answered: usage counts it (as a failed
			// call; its tokens are not known to the store).
			w.failPermanently(t, store.AttemptError{Attempt: t.attempt, Model: t.model, Kind: "unstorable",
				Message: store.UnstorableReason("the provider's answer", err), At: time.Now(), Call: store.CallFailed})
		default:
			failed[i] = err
		}
	}
}

// settleRefused ends b after its settle claimed its succeeded jobs instead
// of writing them finished, because Postgres refused an answer
// (store.AnswersRefused): every row taken for the settle is written
// claimed, and the succeeded jobs' results are stored as updates, one by
// one where needed (storeUpdates), before their deliveries are settled.
func (w *Worker) settleRefused(b *parkedBatch, claim []*unwritten, refused *store.AnswersRefused, start time.Time) {
	w.log.Warn("settle locked parked jobs: an answer was refused; storing the results one by one", "jobs", len(b.succeeded), "error", refused.Err)
	b.endWriting(rowWritten)
	w.metrics.jobs.WithLabelValues("written_claimed").Add(float64(len(b.succeeded) + len(claim)))
	cs := b.succeeded
	idx := make([]int, len(cs))
	for i := range idx {
		idx[i] = i
	}
	ok, failed, handled := make([]bool, len(cs)), make([]error, len(cs)), make([]bool, len(cs))
	w.storeUpdates(cs, idx, ok, failed, handled)
	end := time.Now()
	w.metrics.storeLatency.WithLabelValues("complete_batch").Observe(end.Sub(start).Seconds())
	w.settleUnhandled(cs, ok, failed, handled, start, end)
}
