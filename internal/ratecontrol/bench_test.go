package ratecontrol

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/cpustat"
	"github.com/llmq/llmq/internal/ratecontrol/flow"
)

// reportCPU reports the process's CPU time per op as cpu-ns/op next to
// ns/op: on a shared, loaded machine the wall time per op mostly measures
// waiting for a core.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpustat.Process()-start)/float64(b.N), "cpu-ns/op")
}

// benchLimits never make a caller wait, so the benchmarks measure the
// bookkeeping of admission + settle, not the waits.
var benchLimits = Limits{RPM: 1e12, TPM: 1e15, MaxConcurrency: 1 << 20, Warmup: -1}

func benchGovernor(b *testing.B, s Strategy, opts ...Option) *Governor {
	b.Helper()
	return NewGovernor(s, benchLimits, append(opts, WithController(flow.ControllerConfig{Initial: 1 << 20, Max: 1 << 20}))...)
}

// benchClock moves 250 µs each time it is read (about 1 ms a call): auto's
// token log then holds a minute of bookings, as at 1,000 calls a second,
// and prunes as it would in service. On the wall clock a benchmark books a
// million calls in the log's first second and measures the growth of one
// ever larger slice instead. (Sequential callers only: a caller holding a
// reading older than another's would wait out the difference for real.)
func benchClock() func() time.Time {
	t0 := time.Now()
	var ticks atomic.Int64
	return func() time.Time { return t0.Add(time.Duration(ticks.Add(1)) * 250 * time.Microsecond) }
}

func BenchmarkGovernorAcquireSettle(b *testing.B) {
	for _, s := range Strategies {
		b.Run(string(s), func(b *testing.B) {
			g := benchGovernor(b, s, WithClock(benchClock()))
			ctx := context.Background()
			req := Request{InputTokens: 500, MaxTokens: 256}
			res := Result{PromptTokens: 520, CompletionTokens: 200, Latency: time.Second}
			b.ReportAllocs()
			c0 := cpustat.Process()
			for b.Loop() {
				p, err := g.Acquire(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				p.Settle(res)
			}
			reportCPU(b, c0)
		})
	}
}

func BenchmarkGovernorAcquireSettleParallel(b *testing.B) {
	for _, s := range []Strategy{StrategyRateLimit, StrategyAuto} {
		b.Run(string(s), func(b *testing.B) {
			g := benchGovernor(b, s)
			req := Request{InputTokens: 500, MaxTokens: 256}
			res := Result{PromptTokens: 520, CompletionTokens: 200, Latency: time.Second}
			b.ReportAllocs()
			c0 := cpustat.Process()
			defer reportCPU(b, c0)
			acquireSettleParallel(b, g, req, res)
		})
	}
}

func BenchmarkClassify429(b *testing.B) {
	body := []byte(`{"error":{"message":"Requests rate limit exceeded","type":"limit_requests","code":"limit_requests"}}`)
	b.ReportAllocs()
	for b.Loop() {
		Classify(429, nil, body)
	}
}

// BenchmarkAutoPacedSends runs auto on the wall clock at limits far above
// what one process sends (RPM 1,000,000, no warm-up) with 200 callers and
// reports the sends a second it lets through: the pacer's slots (60 µs)
// are shorter than a timer sleeps, which is what this measures.
func BenchmarkAutoPacedSends(b *testing.B) {
	g := NewGovernor(StrategyAuto, Limits{RPM: 1e6, TPM: 1e12, Warmup: -1})
	req := Request{InputTokens: 300, MaxTokens: 50}
	res := Result{PromptTokens: 300, CompletionTokens: 20, Latency: time.Millisecond}
	b.SetParallelism(100) // 200 callers on two cores
	start := time.Now()
	acquireSettleParallel(b, g, req, res)
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "sends/s")
}

// acquireSettleParallel acquires and settles b.N permits of g from
// b.RunParallel's callers.
func acquireSettleParallel(b *testing.B, g *Governor, req Request, res Result) {
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			p, err := g.Acquire(ctx, req)
			if err != nil {
				b.Error(err)
				return
			}
			p.Settle(res)
		}
	})
}
