package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/store"
)

// task is one delivery from the moment it is read until it is settled.
type task struct {
	d        broker.Delivery
	lane     job.Priority
	body     []byte
	job      job.Job
	attempt  int
	rec      store.Record
	model    string // the model this attempt calls
	estimate int
	received time.Time
}

// intake reads one lane's deliveries until ctx ends. Each delivery takes a
// MaxInFlight slot, is parsed (malformed → dead letter) and queued for a
// batched claim.
func (w *Worker) intake(ctx context.Context, lane job.Priority, ch <-chan broker.Delivery, claimer *batcher[*task]) {
	for {
		select {
		case <-ctx.Done():
			return
		case w.slots <- struct{}{}:
		}
		var d broker.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			<-w.slots
			return
		case d, ok = <-ch:
		}
		if !ok {
			<-w.slots
			return
		}
		w.tasks.Add(1)
		msg := d.Message()
		t := &task{d: d, lane: lane, body: msg.Body, received: time.Now()}
		w.metrics.received.WithLabelValues(string(lane)).Inc()
		j, reason := w.parse(msg.Body)
		if reason != "" {
			w.deadLetterMalformed(t, j, reason)
			continue
		}
		t.job = j
		claimer.Add(t)
	}
}

// parse decodes and validates a job message. A deadline in the past is not
// a validation failure here: such a job is claimed and then marked dead.
func (w *Worker) parse(body []byte) (job.Job, string) {
	j, err := job.Decode(body, w.cfg.Limits)
	if err != nil {
		return j, err.Error()
	}
	j.Normalize()
	deadline := j.Deadline
	j.Deadline = nil
	err = j.Validate(time.Now(), w.cfg.Limits)
	j.Deadline = deadline
	if err != nil {
		return j, err.Error()
	}
	if len(w.cfg.Models) > 0 {
		if _, ok := w.cfg.Models[j.Model]; !ok {
			return j, fmt.Sprintf("invalid job: model: %q is not a configured model", j.Model)
		}
	}
	return j, ""
}

// claimBatch claims a batch of parsed jobs in one round trip and routes
// each by its claim outcome.
func (w *Worker) claimBatch(ts []*task) {
	jobs := make([]job.Job, len(ts))
	for i, t := range ts {
		jobs[i] = t.job
	}
	start := time.Now()
	claims, err := w.store.ClaimBatch(w.bg, jobs, w.cfg.Owner, w.cfg.Lease)
	w.metrics.storeLatency.WithLabelValues("claim_batch").Observe(time.Since(start).Seconds())
	if err != nil {
		w.log.Error("claim batch failed; messages will come back", "jobs", len(ts), "error", err)
		for _, t := range ts {
			w.settle(t, "nack", t.d.Retry(w.bg, time.Second, nil))
			w.done(t, true)
		}
		return
	}
	for i, t := range ts {
		c := claims[i]
		switch c.Outcome {
		case store.Claimed:
			t.attempt, t.rec = c.Attempt, c.Record
			w.track(t)
			w.route(t)
		case store.AlreadyFinished, store.Cancelled:
			w.metrics.jobs.WithLabelValues("duplicate").Inc()
			w.settle(t, "ack", t.d.Ack(w.bg))
			w.done(t, false)
		case store.Busy, store.NotDue:
			w.metrics.jobs.WithLabelValues("deferred").Inc()
			w.settle(t, "retry", t.d.Retry(w.bg, c.RetryIn+10*time.Millisecond, nil))
			w.done(t, false)
		case store.Exhausted:
			t.rec, t.attempt = c.Record, c.Record.Attempts
			last := lastError(c.Record.Errors)
			w.deadLetter(t, "attempts exhausted", last)
		default:
			w.log.Error("unknown claim outcome; handing message back", "job_id", t.job.ID, "outcome", c.Outcome.String())
			w.settle(t, "nack", t.d.Nack(w.bg))
			w.done(t, true)
		}
	}
}

// route sends a claimed job to its model's dispatcher, unless its deadline
// has passed.
func (w *Worker) route(t *task) {
	if dl := t.job.Deadline; dl != nil && !time.Now().Before(*dl) {
		w.markDead(t, "deadline passed", store.AttemptError{Kind: "deadline", Model: t.job.Model, Message: "deadline passed before the call"})
		return
	}
	t.model = w.chooseModel(&t.job, t.rec.Errors)
	t.estimate = ratecontrol.EstimateTokens(t.job.Request)
	w.dispatcherFor(t.model).push(t)
}

func (w *Worker) settle(t *task, op string, err error) {
	if err != nil {
		w.log.Warn("settle delivery", "op", op, "job_id", t.job.ID, "error", err)
	}
}

func lastError(errs []store.AttemptError) store.AttemptError {
	if len(errs) == 0 {
		return store.AttemptError{}
	}
	return errs[len(errs)-1]
}
