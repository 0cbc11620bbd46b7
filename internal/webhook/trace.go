package webhook

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
)

// startTrace starts the client span of one attempt of del, a child of its
// job's trace context (docs/design.md#tracing); send injects the span as
// the request's traceparent. Nothing when tracing is off or the job
// carries no context.
func (d *Dispatcher) startTrace(ctx context.Context, del store.WebhookDelivery) (context.Context, trace.Span) {
	if !d.tracer.On() || del.TraceParent == "" {
		return ctx, nil
	}
	attrs := append(telemetry.JobAttrs(job.Key{Tenant: del.Tenant, ID: del.JobID}, "", del.Attempts+1),
		telemetry.KeyHTTPHost.String(hostOf(del.URL)))
	return d.tracer.Start(telemetry.FromStored(ctx, del.TraceParent, del.TraceState), telemetry.SpanWebhook,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// endTrace ends an attempt's span with the receiver's answer.
func endTrace(span trace.Span, res result) {
	if span == nil {
		return
	}
	if res.status != 0 {
		span.SetAttributes(telemetry.KeyHTTPStatus.Int(res.status))
	}
	var err error
	if !res.ok() {
		err = errors.New(res.err)
	}
	telemetry.End(span, err)
}
