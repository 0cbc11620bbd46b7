package api

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/telemetry"
)

// traced serves h under the server span name, a child of the caller's W3C
// traceparent (docs/design.md#tracing); h itself when tracing is off. The
// submit handlers carry the span's context into each job they store
// (carryTrace), so the job's later spans join the caller's trace.
func (s *Server) traced(name string, h http.Handler) http.Handler {
	if !s.tracer.On() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := s.tracer.Start(telemetry.FromHeaders(r.Context(), r.Header), name,
			trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("http.route", name)))
		defer span.End()
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r.WithContext(ctx))
		if rec.code == 0 {
			rec.code = http.StatusOK
		}
		span.SetAttributes(telemetry.KeyHTTPStatus.Int(rec.code))
		if rec.code >= 500 {
			span.SetStatus(codes.Error, http.StatusText(rec.code))
		}
	})
}

// carryTrace stores the request's span context (ctx, the request's) with
// j, and names j on the span when the request submits one job.
func (s *Server) carryTrace(ctx context.Context, j *job.Job, single bool) {
	if !s.tracer.On() {
		return
	}
	telemetry.Carry(ctx, j)
	if single {
		trace.SpanFromContext(ctx).SetAttributes(telemetry.JobAttrs(j.Key(), j.Model, 0)...)
	}
}
