package ratecontrol

import (
	"context"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/cpustat"
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

func benchGovernor(b *testing.B, s Strategy) *Governor {
	b.Helper()
	return NewGovernor(s, benchLimits, WithController(ControllerConfig{Initial: 1 << 20, Max: 1 << 20}))
}

func BenchmarkGovernorAcquireSettle(b *testing.B) {
	for _, s := range Strategies {
		b.Run(string(s), func(b *testing.B) {
			g := benchGovernor(b, s)
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
		})
	}
}

func BenchmarkBucketReserve(b *testing.B) {
	t0 := time.Unix(0, 0)
	bk := NewBucket(1e12, 1e12, 1e12, t0)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		bk.Reserve(t0.Add(time.Duration(i)), 1)
	}
}

func BenchmarkClassify429(b *testing.B) {
	body := []byte(`{"error":{"message":"Requests rate limit exceeded","type":"limit_requests","code":"limit_requests"}}`)
	b.ReportAllocs()
	for b.Loop() {
		Classify(429, nil, body)
	}
}
