package ingest

import (
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/telemetry"
)

// traceIntake starts the ingest span of each message of a batch, a child
// of the traceparent header its publisher set (docs/design.md#tracing),
// and carries the span's context into each valid job, so that the job's
// attempts join the publisher's trace. It returns the spans for endTraces;
// nil when tracing is off.
func (in *Ingester) traceIntake(msgs []message, verdicts []verdict) []trace.Span {
	if !in.tracer.On() {
		return nil
	}
	spans := make([]trace.Span, len(msgs))
	for i, m := range msgs {
		ctx := telemetry.FromMessage(in.bg, m.d.Message().Headers)
		ctx, spans[i] = in.tracer.Start(ctx, telemetry.SpanIngest, trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(telemetry.KeyLane.String(string(m.lane))))
		if v := &verdicts[i]; v.failure == nil {
			spans[i].SetAttributes(telemetry.JobAttrs(v.job.Key(), v.job.Model, 0)...)
			telemetry.Carry(ctx, &v.job)
		}
	}
	return spans
}

// endTraces ends the spans of traceIntake with each message's outcome.
func endTraces(spans []trace.Span, outcomes []outcome) {
	for i, span := range spans {
		o := "recorded"
		if outcomes[i] == handBack {
			o = "handed_back"
		}
		span.SetAttributes(telemetry.KeyOutcome.String(o))
		span.End()
	}
}
