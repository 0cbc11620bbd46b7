package telemetry_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/telemetry"
)

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// Tracing is off unless an exporter is configured, and a setting llmq
// cannot honour is an error naming the variable, not silence.
func TestFromEnv(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		env     map[string]string
		on      bool
		wantErr string
	}{
		{name: "nothing set", env: nil},
		{name: "exporter none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}},
		{name: "sdk disabled", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}},
		{name: "otlp", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true},
		{name: "endpoint alone", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, on: true},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "OTEL_TRACES_EXPORTER"},
		{name: "grpc", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, wantErr: "OTEL_EXPORTER_OTLP_PROTOCOL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp, stop, err := telemetry.FromEnv(ctx, "llmq-test", envOf(tc.env))
			defer stop()
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.on, tp != nil)
			assert.Equal(t, tc.on, telemetry.New(tp).On())
		})
	}
}

func TestNewOffForNoop(t *testing.T) {
	assert.False(t, telemetry.New(nil).On())
	assert.False(t, telemetry.New(noop.NewTracerProvider()).On())
}

// A job carries its span's context through its row: what Carry writes,
// FromJob reads back as the parent of the job's later spans, and Inject
// sends on.
func TestCarryAndContinue(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := telemetry.New(tp)

	caller := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "Tracestate": {"a=1"}}
	ctx, submit := tr.Start(telemetry.FromHeaders(context.Background(), caller), "submit")
	var j job.Job
	telemetry.Carry(ctx, &j)
	submit.End()
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-"+submit.SpanContext().SpanID().String()+"-01", j.TraceParent)
	assert.Equal(t, "a=1", j.TraceState)

	ctx, attempt := tr.Start(telemetry.FromJob(context.Background(), j), "attempt")
	h := http.Header{}
	telemetry.Inject(ctx, h)
	attempt.End()
	spans := exp.GetSpans()
	require.Len(t, spans, 2)
	assert.Equal(t, submit.SpanContext().SpanID(), spans[1].Parent.SpanID())
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-"+attempt.SpanContext().SpanID().String()+"-01", h.Get("traceparent"))

	// Kafka record headers and AMQP headers arrive as a map.
	mctx := telemetry.FromMessage(context.Background(), map[string]string{"traceparent": caller.Get("traceparent")})
	assert.Equal(t, "00f067aa0ba902b7", trace.SpanContextFromContext(mctx).SpanID().String())
}

// With tracing off nothing is carried or sent, and nothing allocates.
func TestOffCarriesNothing(t *testing.T) {
	var j job.Job
	h := http.Header{}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		telemetry.Carry(ctx, &j)
		telemetry.Inject(ctx, h)
		_ = telemetry.FromJob(ctx, j)
		_ = telemetry.FromMessage(ctx, nil)
		telemetry.End(nil, nil)
	})
	assert.Zero(t, allocs)
	assert.Empty(t, j.TraceParent)
	assert.Empty(t, h)
	bad := telemetry.FromHeaders(ctx, http.Header{"Traceparent": {"not-a-traceparent"}})
	assert.False(t, trace.SpanContextFromContext(bad).IsValid())
}
