package worker

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/cpustat"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/internal/testsvc"
)

// benchModels: the pipeline benchmarks measure llmq's own overhead, so the
// model has no limits and the "retry" strategy (admission without buckets).
var benchModels = map[string]config.Model{"bench": {Strategy: "retry"}}

// BenchmarkPipeline publishes b.N jobs, then times one consumer taking them
// from the broker to `succeeded` in Postgres against an instant provider.
// Run with -benchtime=5000x (b.N is the number of jobs).
func BenchmarkPipeline(b *testing.B) {
	b.Run("rabbitmq", func(b *testing.B) {
		_, pub, sub := rabbitClients(b)
		benchPipeline(b, pub, sub, nil)
	})
	// With a subscriber to every result event (a queue bound to
	// llmq.results with "#"), the events are published, not skipped.
	b.Run("rabbitmq-subscribed", func(b *testing.B) {
		cfg, pub, sub := rabbitClients(b)
		bindResults(b, cfg)
		benchPipeline(b, pub, sub, nil)
	})
	b.Run("kafka", func(b *testing.B) {
		ctx := context.Background()
		cfg := kafka.Config{Brokers: testsvc.KafkaBrokers(b), Prefix: testsvc.KafkaPrefix(b)}
		pub, err := kafka.NewPublisher(ctx, cfg)
		require.NoError(b, err)
		defer pub.Close()
		sub, err := kafka.NewSubscriber(ctx, cfg)
		require.NoError(b, err)
		defer sub.Close()
		benchPipeline(b, pub, sub, nil)
	})
	b.Run("memory", func(b *testing.B) {
		mem := memory.New(memory.Config{})
		defer mem.Close()
		benchPipeline(b, mem.Publisher(), mem.Subscriber(), nil)
	})
	// Tracing on, every span recorded and exported to nowhere: what the
	// spans cost beside "memory" (tracing off).
	b.Run("memory-traced", func(b *testing.B) {
		mem := memory.New(memory.Config{})
		defer mem.Close()
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		benchPipeline(b, mem.Publisher(), mem.Subscriber(), telemetry.New(tp))
	})
}

// benchPipeline runs the pipeline benchmark; tracer nil is tracing off.
func benchPipeline(b *testing.B, pub broker.Publisher, sub broker.Subscriber, tracer *telemetry.Tracer) {
	h := newHarness(b, sim.Config{Models: map[string]sim.ModelConfig{"bench": {}}}, benchModels)
	h.tracer = tracer
	n := b.N
	// The jobs are stored and their messages on the lanes before the clock
	// starts, as the API or the ingester leave them.
	bodies := make([][]byte, n)
	for i := range n {
		bodies[i] = jobBody(fmt.Sprintf("bench-%d", i), "bench", i, nil)
	}
	h.submitMany(pub, bodies)
	cfg := h.cfg
	cfg.Prefetch, cfg.MaxInFlight = 500, 1500
	b.ResetTimer()
	cpu := cpustat.Start(h.pool, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	start := time.Now()
	finish := benchRelay(b, h.store, pub)
	_, stop := h.start(sub, cfg)
	got := h.wait(n, 5*time.Minute)
	elapsed := time.Since(start)
	finish()
	b.StopTimer()
	cpu.Report(b, n, "consumer")
	stop()
	require.Equal(b, n, got["succeeded"])
	b.ReportMetric(float64(n)/elapsed.Seconds(), "jobs/s")
	if mfs, err := h.reg.Gather(); err == nil {
		for _, mf := range mfs {
			if mf.GetName() != "llmq_worker_store_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				hs := m.GetHistogram()
				b.Logf("store %s: %d round trips, mean %.2f ms", m.GetLabel()[0].GetValue(), hs.GetSampleCount(),
					1000*hs.GetSampleSum()/float64(max(hs.GetSampleCount(), 1)))
			}
		}
	}
}

// BenchmarkInFlightMemory holds n jobs in flight (the provider never
// answers until shutdown) and reports the process heap and RSS: n = 1,000
// and config.DefaultMaxInFlight. RSS is the process's, so run one size at
// a time (-bench 'InFlightMemory/4000$').
func BenchmarkInFlightMemory(b *testing.B) {
	for _, n := range []int{1000, config.DefaultMaxInFlight} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for range b.N {
				inFlightMemory(b, n)
			}
		})
	}
}

func inFlightMemory(b *testing.B, n int) {
	h := newHarness(b, sim.Config{Models: map[string]sim.ModelConfig{"bench": {
		Latency: &sim.LatencyConfig{TTFT: sim.Duration(time.Hour)}}}}, benchModels)
	mem := memory.New(memory.Config{})
	defer mem.Close()
	// stored and on their lanes, as the API or the ingester leave them:
	// a lane delivery without its row is not run
	bodies := make([][]byte, n)
	for i := range n {
		bodies[i] = jobBody(fmt.Sprintf("mem-%d", i), "bench", i, nil)
	}
	h.submitMany(mem.Publisher(), bodies)
	entered := &enteredProvider{Provider: h.prov, entered: make(chan struct{}, n)}
	h.call = entered
	cfg := h.cfg
	cfg.Prefetch, cfg.MaxInFlight, cfg.ShutdownGrace = 400, n, time.Millisecond
	_, stop := h.start(mem.Subscriber(), cfg)
	defer stop()
	entered.waitFor(b, n, 5*time.Minute)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MB")
	b.ReportMetric(rssMB(), "rss-MB")
	b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
}

func rssMB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

var _ = job.PriorityHigh
