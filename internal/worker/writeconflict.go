package worker

import (
	"errors"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// A job taken write-once runs before its row exists, and when the row is
// written its key may have been taken meanwhile: by the same job (its
// second message, stored by the API or another replica), or by another
// job under the same id. The ingester acks a duplicate and records a
// conflicting message as a conflict dead letter, leaving the stored job
// alone; the worker does the same for the messages it settles.

// settleTaken sorts the rows whose insert found their key taken; holders[i]
// is the job that holds rs[i]'s key (nil: read it; a duplicate's is read
// again, to pin it). It returns the rows
// whose intake messages are to be acked as written: duplicates, and
// conflicts once their dead letter is recorded. A row whose holder or dead
// letter could not be read or recorded has its message handed back, and
// the ingester judges it again.
func (w *Worker) settleTaken(rs []*unwritten, holders []*job.Job) (ack []*unwritten) {
	for i, r := range rs {
		holder := holders[i]
		if holder == nil || job.Same(r.job, *holder) {
			// A duplicate acks its message as stored, so its job is read
			// through store.Resubmitted, which pins it: a submission whose
			// publish fails cannot take it back after that.
			rec, err := w.store.Resubmitted(w.bg, r.job.Key())
			if err != nil {
				if !errors.Is(err, store.ErrNotFound) {
					w.log.Warn("read the job holding a key taken meanwhile", "job_id", r.job.ID, "error", err)
				}
				w.handBackIntake(r)
				continue
			}
			holder = &rec.Job
		}
		switch {
		case job.Same(r.job, *holder):
			ack = append(ack, r)
		case w.recordConflict(r):
			ack = append(ack, r)
		default:
			w.handBackIntake(r)
		}
	}
	return ack
}

// recordConflict records r's intake message as a conflict dead letter.
func (w *Worker) recordConflict(r *unwritten) bool {
	dl := store.DeadLetterRow{Kind: store.DeadLetterMessage, Tenant: r.job.Tenant, JobID: r.job.ID,
		Lane: string(r.intake.Lane()), Reason: store.ReasonConflict, Body: r.intake.Message().Body}
	err := w.tryStore("record conflict", 1, func() error {
		_, err := w.store.RecordDeadLetter(w.bg, dl)
		return err
	})
	if err != nil {
		w.log.Warn("record an intake message that conflicts with the stored job", "job_id", r.job.ID, "error", err)
		return false
	}
	w.log.Warn("intake message conflicts with the stored job; dead-lettered, the job is untouched",
		"tenant", r.job.Tenant, "job_id", r.job.ID)
	return true
}
