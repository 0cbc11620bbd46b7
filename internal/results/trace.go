package results

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
)

// traceEvents starts the span of each event's publish, a child of the
// context its job carries in its row (docs/design.md#tracing); nil when
// tracing is off or no job of the round carries one.
func (r *Relay) traceEvents(ctx context.Context, events []store.ResultEvent) []trace.Span {
	if !r.p.Tracer.On() {
		return nil
	}
	var spans []trace.Span
	for _, e := range events {
		j := e.Job
		if j.TraceParent == "" {
			continue
		}
		attrs := append(telemetry.JobAttrs(j.Key(), j.Model, j.Attempts), telemetry.KeyStatus.String(string(j.Status)))
		_, span := r.p.Tracer.Start(telemetry.FromJob(ctx, j.Job), telemetry.SpanResult,
			trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
		spans = append(spans, span)
	}
	return spans
}

// endEvents ends the spans of traceEvents with the round's outcome.
func endEvents(spans []trace.Span, err error) {
	for _, s := range spans {
		telemetry.End(s, err)
	}
}
