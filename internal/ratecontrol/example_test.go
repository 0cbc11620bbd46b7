package ratecontrol_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/llmq/llmq/internal/ratecontrol"
)

// The consumer's loop around one provider call: estimate, acquire (admission
// on every dimension → concurrency slot → pacing), send, classify, settle.
func ExampleGovernor() {
	g := ratecontrol.NewGovernor(ratecontrol.StrategyAuto, ratecontrol.Limits{
		RPM: 60_000, TPM: 10_000_000, MaxConcurrency: 8,
		Warmup: -1, // no warm-up, so the example does not wait long
	})
	body := []byte(`{"messages":[{"role":"user","content":"Summarise ticket 4711 in one line."}],"max_tokens":64}`)
	p, err := g.Acquire(context.Background(), ratecontrol.Request{
		InputTokens: ratecontrol.EstimateTokens(body), MaxTokens: 64,
	})
	if err != nil {
		fmt.Println("not sent:", err)
		return
	}
	// ... send the request; here the provider answered 200 with usage ...
	h := http.Header{"X-Ratelimit-Remaining-Tokens": {"9999000"}}
	p.Settle(ratecontrol.Result{
		Class:        ratecontrol.Classify(http.StatusOK, h, nil),
		PromptTokens: 20, CompletionTokens: 12, Latency: 800 * time.Millisecond, Headers: h,
	})
	s := g.Snapshot()
	fmt.Println("strategy:", s.Strategy, "in flight:", s.InFlight, "granted:", s.Granted)
	fmt.Printf("input ratio learned: %.2f\n", s.Calibration.InputRatio)

	// A 429 says which quota was hit and whether to fall back.
	c := ratecontrol.Classify(http.StatusTooManyRequests, http.Header{"Retry-After": {"2"}},
		[]byte(`{"code":"Throttling.AllocationQuota","message":"Allocated quota exceeded"}`))
	fmt.Println(c.Kind, c.Kind.RateLimited(), c.RetryAfter)
	// Output:
	// strategy: auto in flight: 0 granted: 1
	// input ratio learned: 1.18
	// rate_limit_tokens true 2s
}
