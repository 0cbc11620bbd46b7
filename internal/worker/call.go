package worker

import (
	"context"
	"errors"
	"strconv"
	"time"

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
	ctx, stop := w.callContext(t)
	defer stop()
	w.metrics.inflight.WithLabelValues(t.model).Inc()
	ctx, span := w.startCall(ctx, t)
	t.callStart = time.Now()
	resp, err := w.send(ctx, t)
	t.callEnd = time.Now()
	endCall(span, resp, err)
	w.metrics.inflight.WithLabelValues(t.model).Dec()
	if err != nil && w.callCut(t, permit) {
		return
	}
	if err == nil {
		t.httpStatus = 200
		w.metrics.callLatency.WithLabelValues(t.model, "ok").Observe(resp.Latency.Seconds())
		prompt, completionTokens := metered(t, resp)
		permit.Settle(ratecontrol.Result{
			Class:        ratecontrol.Classification{Kind: ratecontrol.KindOK, Status: 200},
			PromptTokens: prompt, CompletionTokens: completionTokens,
			Latency: resp.Latency, Headers: resp.Headers,
		})
		w.metrics.calls.WithLabelValues(t.model, "200").Inc()
		w.limits.settle(t.job.Tenant, t.estimate, resp.PromptTokens+resp.CompletionTokens)
		w.metrics.tokensSettled.WithLabelValues(t.model).Add(float64(resp.PromptTokens + resp.CompletionTokens))
		w.metrics.tenant.call(t.key.Tenant, t.model, tenantCallOK, resp.PromptTokens, resp.CompletionTokens)
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
	t.httpStatus = cl.Status
	code := "error"
	if cl.Status != 0 {
		code = strconv.Itoa(cl.Status)
	}
	w.metrics.calls.WithLabelValues(t.model, code).Inc()
	w.metrics.tenant.call(t.key.Tenant, t.model, tenantOutcome(cl), 0, 0)
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
	if !w.written(t) {
		return
	}
	now := time.Now()
	ae := store.AttemptError{Attempt: t.attempt, Model: t.model, Kind: cl.Kind.String(), Code: cl.Code, Message: cl.Message, At: now,
		Trace: t.trace()}
	if ae.Message == "" {
		ae.Message = cl.Kind.String()
	}
	// Every failure that reaches here was a call: usage counts it.
	ae.Call = store.CallFailed
	if cl.Kind.RateLimited() {
		ae.Call = store.CallRateLimited
	}
	if !cl.Kind.Retryable() && !cl.Kind.RateLimited() {
		w.failPermanently(t, ae)
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
			w.markDead(t, store.ReasonExhausted+" (rate limited)", ae)
			return
		}
		next := w.chooseModel(&t.job, errs)
		if next != t.model {
			delay = 0 // a different model with its own quota: go now
			w.metrics.fallbacks.WithLabelValues(t.model, next).Inc()
			w.log.Info("falling back", "job_id", t.key.ID, "from", t.model, "to", next)
		} else {
			delay = w.backoff.Delay(count429(errs, t.model), cl.RetryAfter)
		}
	} else {
		failures := countFailures(errs)
		if failures >= maxAttempts(t) || t.attempt >= maxAttempts(t) {
			w.markDead(t, store.ReasonExhausted, ae)
			return
		}
		delay = w.backoff.Delay(failures, cl.RetryAfter)
	}
	at := now.Add(delay)
	if dl := t.job.Deadline; dl != nil && at.After(*dl) {
		w.markDead(t, "deadline passed", ae)
		return
	}
	ok, err := schedule(w.bg, w.held(t), at, ae)
	if !w.transitioned(t, "schedule retry", ok, err) {
		return
	}
	w.metrics.jobs.WithLabelValues("retried").Inc()
	w.traceOutcome(t, "retrying")
	t.rec.Status = job.StatusRetrying
	w.retryLater(t, delay)
}

// callContext is the context of t's provider call: it ends with the
// shutdown grace, at the job's deadline, and when the job's tenant cancels
// it (Abort).
func (w *Worker) callContext(t *task) (context.Context, context.CancelFunc) {
	parent := w.callParents[w.callTurn.Add(1)%callParentShards]
	ctx, stop := parent, context.CancelFunc(func() {})
	if dl := t.job.Deadline; dl != nil {
		ctx, stop = context.WithDeadline(ctx, *dl)
	}
	ctx, cancel := context.WithCancel(ctx)
	w.mu.Lock()
	t.stopCall = cancel
	aborted := t.aborted
	w.mu.Unlock()
	if aborted {
		cancel()
	}
	return ctx, func() { cancel(); stop() }
}

// callParentShards is how many parents calls' contexts take turns on.
const callParentShards = 16

// callCut settles a call that ended because its job was cancelled or its
// deadline passed, and reports whether it did. The provider may have
// counted the call, so its admission stays booked (no usage to settle it
// from).
func (w *Worker) callCut(t *task, permit *ratecontrol.Permit) bool {
	w.mu.Lock()
	aborted := t.aborted
	w.mu.Unlock()
	cut := ratecontrol.Result{Class: ratecontrol.Classification{Kind: ratecontrol.KindCanceled}}
	switch {
	case aborted:
		permit.Settle(cut)
		w.metrics.jobs.WithLabelValues("cancelled").Inc()
		w.ack(t) // the job is cancelled in the store already
		return true
	case w.hardCtx.Err() == nil && t.job.Deadline != nil && !time.Now().Before(*t.job.Deadline):
		permit.Settle(cut)
		w.markDead(t, "deadline passed", store.AttemptError{Kind: "deadline", Model: t.model, Message: "deadline passed during the call"})
		return true
	}
	return false
}

// Abort stops the job's provider call, or its admission, if this replica
// holds it: its tenant cancelled it (store.ListenCancels).
func (w *Worker) Abort(key job.Key) {
	w.mu.Lock()
	t := w.inflight[key]
	var stop context.CancelFunc
	if t != nil {
		t.aborted = true
		stop = t.stopCall
	}
	w.mu.Unlock()
	if stop != nil {
		stop()
	}
}
