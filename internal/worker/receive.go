package worker

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// task is one delivery from the moment it is read until it is settled.
type task struct {
	d    broker.Delivery
	lane job.Priority
	key  job.Key
	// hold is the group the job counts in while it waits for admission
	// (tenants.go); its model is empty when the message did not name one.
	// holding is set while it counts there.
	hold    holdKey
	holding bool
	// aborted is set when the job's tenant cancelled it while this
	// replica held it; stopCall ends its provider call. Both under w.mu.
	aborted  bool
	stopCall context.CancelFunc
	// job is the stored job (the claim's Record), never the message's copy.
	job job.Job
	// attempt is the attempt number the claim handed out (Claim.Attempt);
	// for a job the claim found exhausted, the attempts it made.
	attempt int
	rec     store.Record
	model   string // the model this attempt calls
	// booked is what admission books besides the request (tokens, or audio
	// seconds for an audio job); estimate is its tokens (kinds.go); maxOut
	// is the request's own output cap (job.MaxTokens), read here and not
	// in the dispatcher, whose one goroutine admits every job of a model.
	booked, estimate, maxOut int
	received                 time.Time
	// claimedAt, callStart, callEnd and httpStatus are the attempt's trace
	// for its entry in the job's attempt log (store.Trace).
	claimedAt, callStart, callEnd time.Time
	httpStatus                    int
	// span is the attempt's trace span (trace.go); nil with tracing off.
	span trace.Span
	// row is set while a job taken write-once may have no row yet
	// (writeonce.go).
	row *unwritten
}

// trace is what the worker saw of t's attempt so far.
func (t *task) trace() store.Trace {
	return store.Trace{ClaimedAt: t.claimedAt, CallStartedAt: t.callStart, CallEndedAt: t.callEnd, HTTPStatus: t.httpStatus}
}

// receive reads one lane's deliveries until ctx ends. Each delivery takes a
// MaxInFlight slot and is queued for a batched claim by the job key its
// message names, or for parking when this replica already holds enough of
// the tenant's jobs (tenants.go).
func (w *Worker) receive(ctx context.Context, lane job.Priority, ch <-chan broker.Delivery) {
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
		t := &task{d: d, lane: lane, received: time.Now()}
		w.metrics.received.WithLabelValues(string(lane)).Inc()
		note, err := broker.ReadLaneNote(d.Message().Body)
		if err != nil {
			// Lanes carry only what llmq published after storing the job.
			w.log.Error("lane message names no job; dropped", "lane", string(lane), "error", err)
			w.metrics.jobs.WithLabelValues("orphan").Inc()
			w.ack(t)
			continue
		}
		t.key = note.Key
		t.hold = holdKey{tenant: note.Key.Tenant, model: note.Model, lane: lane}
		if w.parker != nil && !w.holds.admit(t.hold, note.Unparked, w.saturated(note.Model)) {
			w.parker.Add(t)
			continue
		}
		// admit counted it only where parking is on and the message names
		// the model (holds.admit).
		t.holding = w.parker != nil && t.hold.model != ""
		w.claimer.Add(t)
	}
}

// claimBatch claims a batch of jobs in one round trip and routes each by
// its claim outcome.
func (w *Worker) claimBatch(ts []*task) {
	keys := make([]job.Key, len(ts))
	for i, t := range ts {
		keys[i] = t.key
	}
	start := time.Now()
	claims, err := w.store.ClaimBatch(w.bg, keys, w.cfg.Owner, w.cfg.Lease)
	end := time.Now()
	claimedAt := end
	w.metrics.storeLatency.WithLabelValues("claim_batch").Observe(end.Sub(start).Seconds())
	if err != nil {
		w.log.Error("claim batch failed; messages will come back", "jobs", len(ts), "error", err)
		for _, t := range ts {
			w.retryLater(t, time.Second)
		}
		return
	}
	for i, t := range ts {
		c := claims[i]
		switch c.Outcome {
		case store.Claimed:
			t.attempt, t.rec, t.job, t.claimedAt = c.Attempt, c.Record, c.Record.Job, claimedAt
			w.startTrace(t, start, end)
			w.track(t)
			w.route(t)
		case store.AlreadyFinished, store.Cancelled, store.Batched:
			w.metrics.jobs.WithLabelValues("duplicate").Inc()
			w.ack(t)
		case store.NotFound:
			// A message for a job llmq never stored (a submission whose
			// publish went through but whose commit did not).
			w.metrics.jobs.WithLabelValues("orphan").Inc()
			w.log.Warn("lane message for a job that is not stored; dropped", "tenant", t.key.Tenant, "job_id", t.key.ID)
			w.ack(t)
		case store.NotDue:
			t.rec = c.Record
			w.metrics.jobs.WithLabelValues("deferred").Inc()
			if c.Record.EnqueuedAt == nil {
				// Its delayed message could not be published; the
				// reconciler publishes one when it is due.
				w.ack(t)
				continue
			}
			w.retryLater(t, c.RetryIn+10*time.Millisecond)
		case store.Busy:
			if w.runs(c.Record) {
				// A second message for a job this worker runs now (a
				// handed-back delivery and the reconciler's, say). Its
				// attempt needs no stand-by: if this process dies, its own
				// delivery comes back, or the reconciler republishes a
				// job taken directly.
				w.metrics.jobs.WithLabelValues("duplicate").Inc()
				w.ack(t)
				continue
			}
			w.metrics.jobs.WithLabelValues("deferred").Inc()
			w.retryLater(t, c.RetryIn+10*time.Millisecond)
		case store.Exhausted:
			// The claim moved the job to dead and recorded its dead letter.
			t.rec, t.job, t.attempt = c.Record, c.Record.Job, c.Record.Attempts
			w.deadLettered(t, store.ReasonExhausted)
		default:
			w.log.Error("unknown claim outcome; handing message back", "job_id", t.key.ID, "outcome", c.Outcome.String())
			w.nack(t)
		}
	}
}

// runs reports whether this worker is running rec's attempt now.
func (w *Worker) runs(rec store.Record) bool {
	if rec.LeaseOwner != w.cfg.Owner {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.inflight[rec.Key()]
	return ok
}

// route sends a claimed job to its model's dispatcher, or to a provider
// batch (offload.go), unless its deadline has passed or its model is no
// longer configured.
func (w *Worker) route(t *task) {
	if dl := t.job.Deadline; dl != nil && !time.Now().Before(*dl) {
		w.markDead(t, "deadline passed", store.AttemptError{Kind: "deadline", Model: t.job.Model, Message: "deadline passed before the call"})
		return
	}
	if len(w.cfg.Models) > 0 {
		if _, ok := w.cfg.Models[t.job.Model]; !ok {
			w.failPermanently(t, store.AttemptError{Attempt: t.attempt, Model: t.job.Model, Kind: "invalid",
				Message: fmt.Sprintf("model %q is not a configured model", t.job.Model), At: time.Now()})
			return
		}
		if msg := w.kindMismatch(&t.job); msg != "" {
			w.failPermanently(t, store.AttemptError{Attempt: t.attempt, Model: t.job.Model, Kind: "invalid", Message: msg, At: time.Now()})
			return
		}
	}
	if w.offloads(t) {
		w.markBatched(t)
		return
	}
	t.model = w.chooseModel(&t.job, t.rec.Errors)
	t.booked, t.estimate = estimateInput(&t.job)
	t.maxOut = t.job.MaxTokens()
	w.dispatcherFor(t.model).push(t)
}
