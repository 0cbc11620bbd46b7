package worker

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/telemetry"
)

// A claimed job's attempt is one span (telemetry.SpanJob), a child of the
// context the job carries in its row, so the attempt joins the trace of
// the request or message that submitted the job whichever replica claims
// it (docs/design.md#tracing). Its children: the claim, the wait for
// admission, the provider call (a client span whose context goes out as
// the request's traceparent) and the result's write. With tracing off
// t.span is nil and each function here returns after one nil check.

// startTrace starts t's attempt span once its claim (from claimed to
// now) has handed it the job.
func (w *Worker) startTrace(t *task, claimed, now time.Time) {
	if !w.tracer.On() {
		return
	}
	ctx := telemetry.FromJob(context.Background(), t.job)
	attrs := append(telemetry.JobAttrs(t.key, t.job.Model, t.attempt), telemetry.KeyLane.String(string(t.lane)))
	ctx, t.span = w.tracer.Start(ctx, telemetry.SpanJob, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(claimed), trace.WithAttributes(attrs...))
	_, claim := w.tracer.Start(ctx, telemetry.SpanClaim, trace.WithTimestamp(claimed))
	claim.End(trace.WithTimestamp(now))
}

// traceStep records a finished step of t's attempt as a child span.
func (w *Worker) traceStep(t *task, name string, start, end time.Time) {
	if t.span == nil {
		return
	}
	_, s := w.tracer.Start(trace.ContextWithSpan(context.Background(), t.span), name, trace.WithTimestamp(start))
	s.End(trace.WithTimestamp(end))
}

// traceOutcome names how t's attempt ended on its span.
func (w *Worker) traceOutcome(t *task, outcome string) {
	if t.span != nil {
		t.span.SetAttributes(telemetry.KeyOutcome.String(outcome))
	}
}

// endTrace ends t's attempt span when its delivery is settled.
func (w *Worker) endTrace(t *task) {
	if t.span != nil {
		t.span.End()
		t.span = nil
	}
}

// startCall starts the client span of t's provider call under ctx, the
// call's context, and returns ctx with it.
func (w *Worker) startCall(ctx context.Context, t *task) (context.Context, trace.Span) {
	if t.span == nil {
		return ctx, nil
	}
	attrs := append(telemetry.JobAttrs(t.key, t.model, t.attempt),
		telemetry.KeyGenAIOperation.String("chat"), telemetry.KeyGenAIModel.String(t.model))
	return w.tracer.Start(trace.ContextWithSpan(ctx, t.span), telemetry.CallSpanName(t.model),
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// endCall ends the provider call's span with what the call returned.
func endCall(span trace.Span, resp *provider.Response, err error) {
	if span == nil {
		return
	}
	if err == nil {
		span.SetAttributes(telemetry.KeyHTTPStatus.Int(200),
			telemetry.KeyGenAIInputTokens.Int(resp.PromptTokens), telemetry.KeyGenAIOutputTokens.Int(resp.CompletionTokens))
	}
	var perr *provider.Error
	if errors.As(err, &perr) && perr.Class.Status != 0 {
		span.SetAttributes(telemetry.KeyHTTPStatus.Int(perr.Class.Status))
	}
	telemetry.End(span, err)
}
