// Package telemetry owns llmq's OpenTelemetry tracing: the tracer provider
// built from the standard OTEL_* variables (FromEnv), the W3C trace context
// (traceparent, tracestate) read from HTTP and broker headers and carried
// in a job's row, the span names and the job attributes every span names.
//
// Tracing off is a nil *Tracer: On is a nil check, and callers build
// attributes and start spans only when it is true, so the hot paths
// allocate nothing for tracing when no exporter is configured
// (docs/design.md#tracing).
package telemetry

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/llmq/llmq/internal/job"
)

// Span names: the job's trace from its submission to its stored result.
const (
	// SpanSubmit is the producer's server span of POST /v1/jobs, child of
	// the caller's traceparent; SpanSubmitBatch that of POST /v1/jobs:batch.
	SpanSubmit      = "POST /v1/jobs"
	SpanSubmitBatch = "POST /v1/jobs:batch"
	// SpanReplay and SpanReplayFiltered are the server spans of a
	// dead-letter replay: a message submitted as its tenant's job there
	// carries the span's context, as a submission does.
	SpanReplay         = "POST /v1/dlq/{id}/replay"
	SpanReplayFiltered = "POST /v1/dlq/replay"
	// SpanIngest is the ingester's span of one intake message, child of
	// the message's traceparent header.
	SpanIngest = "llmq.ingest"
	// SpanJob is a consumer's span of one attempt, from the claim to the
	// settlement of its delivery, child of the job's stored context (the
	// submit or ingest span); SpanClaim, SpanAdmit, the provider call
	// (CallSpanName) and SpanComplete are its children.
	SpanJob      = "llmq.job"
	SpanClaim    = "llmq.claim"
	SpanAdmit    = "llmq.admit"
	SpanComplete = "llmq.complete"
	// SpanResult is the relay's span of one result event, child of the
	// job's stored context; SpanWebhook a webhook delivery attempt.
	SpanResult  = "llmq.result"
	SpanWebhook = "llmq.webhook"
)

// CallSpanName is the name of the provider call's client span, as the
// OpenTelemetry GenAI conventions name it ("{operation} {model}").
func CallSpanName(model string) string { return "chat " + model }

// Attribute keys: llmq's own in snake_case under llmq., the provider
// call's from the GenAI and HTTP conventions.
const (
	KeyJobID   = attribute.Key("llmq.job_id")
	KeyTenant  = attribute.Key("llmq.tenant")
	KeyModel   = attribute.Key("llmq.model")
	KeyAttempt = attribute.Key("llmq.attempt")
	KeyLane    = attribute.Key("llmq.lane")
	KeyOutcome = attribute.Key("llmq.outcome")
	KeyStatus  = attribute.Key("llmq.status")

	KeyGenAIOperation    = attribute.Key("gen_ai.operation.name")
	KeyGenAIModel        = attribute.Key("gen_ai.request.model")
	KeyGenAIInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	KeyGenAIOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
	KeyHTTPStatus        = attribute.Key("http.response.status_code")
	KeyHTTPHost          = attribute.Key("server.address")
)

// Tracer starts llmq's spans. A nil *Tracer is tracing off.
type Tracer struct {
	tr trace.Tracer
}

// New is the tracer of tp; nil (off) when tp is nil or a no-op provider.
func New(tp trace.TracerProvider) *Tracer {
	if tp == nil {
		return nil
	}
	if _, noopTP := tp.(noop.TracerProvider); noopTP {
		return nil
	}
	return &Tracer{tr: tp.Tracer("github.com/llmq/llmq")}
}

// On reports whether tracing is on. Check it before building attributes.
func (t *Tracer) On() bool { return t != nil }

// Start starts a span under ctx. Call it only when On.
func (t *Tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return t.tr.Start(ctx, name, opts...)
}

// JobAttrs are the attributes every span of a job names; model and
// attempt when known.
func JobAttrs(key job.Key, model string, attempt int) []attribute.KeyValue {
	a := make([]attribute.KeyValue, 2, 4)
	a[0], a[1] = KeyJobID.String(key.ID), KeyTenant.String(key.Tenant)
	if model != "" {
		a = append(a, KeyModel.String(model))
	}
	if attempt > 0 {
		a = append(a, KeyAttempt.Int(attempt))
	}
	return a
}

// End ends span, recording err as its error when not nil. A nil span is
// tracing off.
func End(span trace.Span, err error, opts ...trace.SpanEndOption) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End(opts...)
}

var w3c = propagation.TraceContext{}

// FromHeaders is ctx with the remote span context of the W3C traceparent
// and tracestate in h; ctx itself when they are absent or malformed.
func FromHeaders(ctx context.Context, h http.Header) context.Context {
	return w3c.Extract(ctx, propagation.HeaderCarrier(h))
}

// FromMessage is FromHeaders for broker message headers (AMQP headers,
// Kafka record headers), whose keys are "traceparent" and "tracestate".
func FromMessage(ctx context.Context, headers map[string]string) context.Context {
	if headers["traceparent"] == "" {
		return ctx
	}
	return w3c.Extract(ctx, propagation.MapCarrier(headers))
}

// FromJob is ctx with the span context a job carries in its row (Carry
// wrote it), so that a consumer on any replica continues the job's trace.
func FromJob(ctx context.Context, j job.Job) context.Context {
	return FromStored(ctx, j.TraceParent, j.TraceState)
}

// FromStored is FromJob for a trace context stored apart from its job (a
// webhook delivery's).
func FromStored(ctx context.Context, traceParent, traceState string) context.Context {
	if traceParent == "" {
		return ctx
	}
	return w3c.Extract(ctx, propagation.MapCarrier{"traceparent": traceParent, "tracestate": traceState})
}

// Carry sets j's trace context to ctx's span, the parent of what happens
// to the job later (its attempts, its result).
func Carry(ctx context.Context, j *job.Job) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	m := propagation.MapCarrier{}
	w3c.Inject(ctx, m)
	j.TraceParent, j.TraceState = m["traceparent"], m["tracestate"]
}

// Traced reports whether ctx carries a span Inject would send on.
func Traced(ctx context.Context) bool {
	return trace.SpanContextFromContext(ctx).IsValid()
}

// Inject writes ctx's span context into h (an outgoing request to the
// provider or a webhook endpoint); nothing when ctx has none, which is
// always the case with tracing off.
func Inject(ctx context.Context, h http.Header) {
	if !Traced(ctx) {
		return
	}
	w3c.Inject(ctx, propagation.HeaderCarrier(h))
}
