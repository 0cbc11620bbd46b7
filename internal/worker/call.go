package worker

import (
	"errors"
	"strconv"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/store"
)

// completion is a successful call waiting for its batched store write.
type completion struct {
	t    *task
	resp *provider.Response
}

// call sends an admitted job and settles its permit and outcome.
func (w *Worker) call(t *task, permit *ratecontrol.Permit) {
	w.metrics.inflight.WithLabelValues(t.model).Inc()
	resp, err := w.prov.Chat(w.hardCtx, t.model, t.job.Request)
	w.metrics.inflight.WithLabelValues(t.model).Dec()
	if err == nil {
		w.metrics.callLatency.WithLabelValues(t.model, "ok").Observe(resp.Latency.Seconds())
		permit.Settle(ratecontrol.Result{
			Class:        ratecontrol.Classification{Kind: ratecontrol.KindOK, Status: 200},
			PromptTokens: resp.PromptTokens, CompletionTokens: resp.CompletionTokens,
			Latency: resp.Latency, Headers: resp.Headers,
		})
		w.metrics.calls.WithLabelValues(t.model, "200").Inc()
		w.metrics.tokensSettled.WithLabelValues(t.model).Add(float64(resp.PromptTokens + resp.CompletionTokens))
		if resp.PromptTokens > 0 {
			w.metrics.estimateError.WithLabelValues(t.model).Observe(float64(t.estimate)/float64(resp.PromptTokens) - 1)
		}
		w.failpoint(FailpointAfterProviderCall)
		w.completer.Add(&completion{t: t, resp: resp})
		return
	}
	var cl ratecontrol.Classification
	var perr *provider.Error
	res := ratecontrol.Result{}
	if errors.As(err, &perr) {
		cl = perr.Class
		res.Latency, res.Headers = perr.Latency, perr.Headers
	} else {
		cl = ratecontrol.ClassifyError(err)
	}
	res.Class = cl
	if res.Latency > 0 {
		outcome := "error"
		if cl.Kind.RateLimited() {
			outcome = "rate_limited"
		}
		w.metrics.callLatency.WithLabelValues(t.model, outcome).Observe(res.Latency.Seconds())
	}
	if w.hardCtx.Err() != nil || cl.Kind == ratecontrol.KindCanceled {
		// Cut by the end of the shutdown grace: not the provider's fault.
		permit.Cancel()
		w.handBack(t)
		return
	}
	permit.Settle(res)
	code := "error"
	if cl.Status != 0 {
		code = strconv.Itoa(cl.Status)
	}
	w.metrics.calls.WithLabelValues(t.model, code).Inc()
	if cl.Kind.RateLimited() {
		w.metrics.rateLimited.WithLabelValues(t.model, cl.Kind.String()).Inc()
		if w.on429 != nil {
			w.on429(t.model, cl)
		}
	}
	w.failed(t, cl)
}

// failed decides what a failed attempt leads to: failed (4xx), a fallback
// or delayed retry (429), a backoff retry (5xx, timeout, connection) or
// dead (attempts exhausted, deadline passed).
func (w *Worker) failed(t *task, cl ratecontrol.Classification) {
	now := time.Now()
	ae := store.AttemptError{Attempt: t.attempt, Model: t.model, Kind: cl.Kind.String(), Code: cl.Code, Message: cl.Message, At: now}
	if ae.Message == "" {
		ae.Message = cl.Kind.String()
	}
	if !cl.Kind.Retryable() && !cl.Kind.RateLimited() {
		ok, err := w.store.Fail(w.bg, t.job.Key(), w.cfg.Owner, t.attempt, ae)
		if err != nil {
			w.log.Error("store permanent failure", "job_id", t.job.ID, "error", err)
			w.settle(t, "nack", t.d.Nack(w.bg))
			w.done(t, true)
			return
		}
		if ok {
			w.metrics.jobs.WithLabelValues("failed").Inc()
			w.log.Info("job failed permanently", "job_id", t.job.ID, "tenant", t.job.Tenant, "model", t.model, "kind", ae.Kind, "code", ae.Code)
		}
		w.settle(t, "ack", t.d.Ack(w.bg))
		w.done(t, false)
		return
	}

	errs := append(append([]store.AttemptError(nil), t.rec.Errors...), ae)
	var delay time.Duration
	// A rate-limited attempt is given back (it does not use up max_attempts),
	// but a job is deferred at most RateLimitAttemptFactor × max_attempts times.
	schedule := w.store.ScheduleRetry
	if cl.Kind.RateLimited() {
		schedule = w.store.DeferRateLimited
		if len(errs)-countFailures(errs) >= w.cfg.RateLimitAttemptFactor*maxAttempts(t) {
			w.markDead(t, "attempts exhausted (rate limited)", ae)
			return
		}
		next := w.chooseModel(&t.job, errs)
		if next != t.model {
			delay = 0 // a different model with its own quota: go now
			w.metrics.fallbacks.WithLabelValues(t.model, next).Inc()
			w.log.Info("falling back", "job_id", t.job.ID, "from", t.model, "to", next)
		} else {
			delay = w.backoff.Delay(count429(errs, t.model), cl.RetryAfter)
		}
	} else {
		failures := countFailures(errs)
		if failures >= maxAttempts(t) || t.attempt >= maxAttempts(t) {
			w.markDead(t, "attempts exhausted", ae)
			return
		}
		delay = w.backoff.Delay(failures, cl.RetryAfter)
	}
	at := now.Add(delay)
	if dl := t.job.Deadline; dl != nil && at.After(*dl) {
		w.markDead(t, "deadline passed", ae)
		return
	}
	ok, err := schedule(w.bg, t.job.Key(), w.cfg.Owner, t.attempt, at, ae)
	if !w.transitioned(t, "schedule retry", ok, err) {
		return
	}
	w.metrics.jobs.WithLabelValues("retried").Inc()
	w.settle(t, "retry", t.d.Retry(w.bg, delay, map[string]string{"x-llmq-attempt": strconv.Itoa(t.attempt)}))
	w.done(t, false)
}

// markDead ends the running attempt as dead and dead-letters the message.
func (w *Worker) markDead(t *task, reason string, ae store.AttemptError) {
	if ae.At.IsZero() {
		ae.At = time.Now()
	}
	if ae.Attempt == 0 {
		ae.Attempt = t.attempt
	}
	ok, err := w.store.MarkDead(w.bg, t.job.Key(), w.cfg.Owner, t.attempt, ae)
	if !w.transitioned(t, "mark dead", ok, err) {
		return
	}
	t.rec.Errors = append(t.rec.Errors, ae)
	w.deadLetter(t, reason, ae)
}

// transitioned settles the delivery when a store transition that ends an
// attempt did not take effect, and reports whether it did. A store error
// hands the message back (nothing was recorded); a lost claim (lease taken
// over, job cancelled) acks it, since the new owner has its own delivery.
func (w *Worker) transitioned(t *task, op string, ok bool, err error) bool {
	if err != nil {
		w.log.Error(op, "job_id", t.job.ID, "error", err)
		w.settle(t, "nack", t.d.Nack(w.bg))
		w.done(t, true)
		return false
	}
	if !ok {
		w.settle(t, "ack", t.d.Ack(w.bg))
		w.done(t, false)
		return false
	}
	return true
}

// deadLetter records the envelope in Postgres and on the broker's DLQ.
func (w *Worker) deadLetter(t *task, reason string, last store.AttemptError) {
	now := time.Now()
	first := now
	if len(t.rec.Errors) > 0 && !t.rec.Errors[0].At.IsZero() {
		first = t.rec.Errors[0].At
	}
	lastAt := now
	if !last.At.IsZero() {
		lastAt = last.At
	}
	lastErr := last.Message
	if last.Code != "" {
		lastErr = last.Code + ": " + last.Message
	}
	// Rate-limited attempts are given back in the store, so the error
	// entries, one per failed call, count the calls made.
	attempts := max(t.attempt, len(t.rec.Errors))
	row := store.DeadLetterRow{
		Tenant: t.job.Tenant, JobID: t.job.ID, Lane: string(t.lane), Reason: reason,
		Attempts: attempts, LastError: lastErr, Body: t.body, FirstFailedAt: first, LastFailedAt: lastAt,
	}
	if _, err := w.store.RecordDeadLetter(w.bg, row); err != nil {
		w.log.Error("record dead letter", "job_id", t.job.ID, "error", err)
	}
	env := broker.DeadLetter{
		Body: t.body, Key: t.job.ID, Reason: reason, Attempts: attempts, LastError: lastErr,
		FirstFailedAt: first, LastFailedAt: lastAt, Lane: t.lane,
	}
	w.settle(t, "dead_letter", t.d.DeadLetter(w.bg, env))
	w.metrics.jobs.WithLabelValues("dead").Inc()
	w.metrics.deadLetters.WithLabelValues(deadReason(reason)).Inc()
	w.log.Warn("job dead-lettered", "job_id", t.job.ID, "tenant", t.job.Tenant, "reason", reason, "attempts", attempts)
	w.done(t, false)
}

// deadLetterMalformed dead-letters a message that is not a valid job.
func (w *Worker) deadLetterMalformed(t *task, j job.Job, reason string) {
	now := time.Now()
	tenant := job.DefaultTenant
	if j.Tenant != "" && job.ValidTenant(j.Tenant) {
		tenant = j.Tenant
	}
	id := ""
	if job.ValidID(j.ID) {
		id = j.ID
	}
	t.job.ID, t.job.Tenant = id, tenant
	row := store.DeadLetterRow{Tenant: tenant, JobID: id, Lane: string(t.lane), Reason: reason, Body: t.body,
		FirstFailedAt: now, LastFailedAt: now}
	if _, err := w.store.RecordDeadLetter(w.bg, row); err != nil {
		w.log.Error("record dead letter", "job_id", id, "error", err)
	}
	env := broker.DeadLetter{Body: t.body, Key: id, Reason: reason, FirstFailedAt: now, LastFailedAt: now, Lane: t.lane}
	w.settle(t, "dead_letter", t.d.DeadLetter(w.bg, env))
	w.metrics.jobs.WithLabelValues("malformed").Inc()
	w.metrics.deadLetters.WithLabelValues("malformed").Inc()
	w.log.Warn("malformed message dead-lettered", "job_id", id, "lane", string(t.lane), "reason", reason)
	w.release(t)
}

func deadReason(reason string) string {
	switch reason {
	case "deadline passed", "attempts exhausted":
		return reason
	}
	if len(reason) >= len("attempts exhausted") && reason[:len("attempts exhausted")] == "attempts exhausted" {
		return "attempts exhausted"
	}
	return "other"
}

// handBack returns a claimed job that was not (fully) attempted: the
// attempt is released in the store and the message redelivered.
func (w *Worker) handBack(t *task) {
	if _, err := w.store.Release(w.bg, t.job.Key(), w.cfg.Owner); err != nil {
		w.log.Error("release job", "job_id", t.job.ID, "error", err)
	}
	w.settle(t, "nack", t.d.Nack(w.bg))
	w.done(t, true)
}

// flushCompletions stores a batch of results, then acks the deliveries
// together (broker.AckAll: one frame for a run of them where the broker
// allows it).
func (w *Worker) flushCompletions(cs []*completion) {
	items := make([]store.Completion, len(cs))
	for i, c := range cs {
		items[i] = store.Completion{Key: c.t.job.Key(), Owner: w.cfg.Owner, Attempt: c.t.attempt, Result: store.Result{
			ModelUsed: c.t.model, Response: c.resp.Body, PromptTokens: c.resp.PromptTokens, CompletionTokens: c.resp.CompletionTokens,
		}}
	}
	start := time.Now()
	ok, err := w.store.CompleteBatch(w.bg, items)
	w.metrics.storeLatency.WithLabelValues("complete_batch").Observe(time.Since(start).Seconds())
	if err != nil {
		for _, c := range cs {
			// The call succeeded but the result could not be stored: the
			// message comes back and the job runs again once its lease expires.
			w.log.Error("store result", "job_id", c.t.job.ID, "error", err)
			w.settle(c.t, "nack", c.t.d.Nack(w.bg))
			w.done(c.t, false)
		}
		return
	}
	w.failpoint(FailpointAfterResultWrite)
	ds := make([]broker.Delivery, len(cs))
	for i, c := range cs {
		ds[i] = c.t.d
		if ok[i] {
			w.metrics.jobs.WithLabelValues("succeeded").Inc()
			w.metrics.latency.WithLabelValues(c.t.model).Observe(time.Since(c.t.received).Seconds())
		} else {
			// Lease lost meanwhile (cancelled or taken over): result dropped.
			w.metrics.jobs.WithLabelValues("lease_lost").Inc()
		}
	}
	for i, err := range broker.AckAll(w.bg, ds) {
		w.settle(cs[i].t, "ack", err)
		w.done(cs[i].t, false)
	}
}
