package telemetry

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// FromEnv builds the tracer provider of a process from the standard
// OpenTelemetry variables, named service unless OTEL_SERVICE_NAME says
// otherwise. It returns a nil provider (tracing off) when
// OTEL_SDK_DISABLED=true, when OTEL_TRACES_EXPORTER=none, and when no
// exporter is configured at all: neither OTEL_TRACES_EXPORTER nor an OTLP
// endpoint. That last case departs from the specification's default of
// "otlp" on purpose: most deployments run no collector, and an llmq that
// does not trace must cost nothing (docs/design.md#tracing).
//
// The one exporter built in is OTLP over HTTP (otlptracehttp, which reads
// OTEL_EXPORTER_OTLP_* itself); the SDK reads OTEL_TRACES_SAMPLER*,
// OTEL_BSP_* and OTEL_RESOURCE_ATTRIBUTES. env looks a variable up (the
// process's os.LookupEnv). stop flushes the spans still queued, waiting
// at most stopTimeout; call it on the way out.
// stopTimeout bounds the flush of the spans still queued at exit: a
// collector that does not answer must not hold a shutdown.
const stopTimeout = 5 * time.Second

func FromEnv(ctx context.Context, service string, env func(string) (string, bool)) (tp trace.TracerProvider, stop func(), err error) {
	getenv := func(k string) string { v, _ := env(k); return v }
	off := func() {}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, off, nil
	}
	exporter := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	if exporter == "" && (getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "") {
		exporter = "otlp"
	}
	switch exporter {
	case "", "none":
		return nil, off, nil
	case "otlp":
	default:
		return nil, off, fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported (otlp or none)", exporter)
	}
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto != "" && proto != "http/protobuf" {
		return nil, off, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL: %q is not supported (http/protobuf)", proto)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, off, fmt.Errorf("otlp trace exporter: %w", err)
	}
	// The service name given first, so that OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES (WithFromEnv, applied after it) override it.
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, off, fmt.Errorf("trace resource: %w", err)
	}
	p := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return p, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		defer cancel()
		_ = p.Shutdown(ctx)
	}, nil
}
