package ratecontrol

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestAutoHeadCallerWaitsOutADrain: a 429 that comes while auto's head
// caller waits for its pacer slot drains that send too; without the check
// it would go out at its slot, into a provider that says it refuses until
// Retry-After.
func TestAutoHeadCallerWaitsOutADrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGovernor(StrategyAuto, Limits{RPS: 2, Warmup: -1})
		req := Request{InputTokens: 10, MaxTokens: 10}
		t0 := time.Now()
		first, err := g.Acquire(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		sent := make(chan time.Time, 1)
		go func() {
			p, err := g.Acquire(t.Context(), req)
			if err != nil {
				t.Error(err)
				sent <- time.Time{}
				return
			}
			sent <- time.Now()
			p.Settle(Result{PromptTokens: 10, CompletionTokens: 10, Latency: time.Millisecond})
		}()
		time.Sleep(10 * time.Millisecond)
		synctest.Wait() // the second caller waits for its pacer slot (~505 ms)
		const retryAfter = 2 * time.Second
		first.Settle(Result{Class: Classification{Kind: KindRateLimitRequests, Status: 429, RetryAfter: retryAfter}})
		at := <-sent
		if d := at.Sub(t0); d < 10*time.Millisecond+retryAfter {
			t.Fatalf("second call sent %v after the first, want after the drain (%v after the 429)", d, retryAfter)
		}
		if d := at.Sub(t0); d > 10*time.Millisecond+retryAfter+time.Second {
			t.Fatalf("second call sent %v after the first, want soon after the drain", d)
		}
	})
}

// TestAutoWarmsUpPerSecondLimits: auto ramps a per-second request limit up
// over the warm-up as it does a minute limit (a backlog at the start does
// not go out at the full RPS in the first second); once warm it paces at
// the limit.
func TestAutoWarmsUpPerSecondLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGovernor(StrategyAuto, Limits{RPS: 20, Warmup: 10 * time.Second, MaxConcurrency: 100})
		req := Request{InputTokens: 10, MaxTokens: 10}
		t0 := time.Now()
		var sends []time.Duration
		for time.Since(t0) < 16*time.Second {
			p, err := g.Acquire(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			sends = append(sends, time.Since(t0))
			p.Settle(Result{PromptTokens: 10, CompletionTokens: 10, Latency: time.Millisecond})
		}
		count := func(from, to time.Duration) int {
			n := 0
			for _, s := range sends {
				if s >= from && s < to {
					n++
				}
			}
			return n
		}
		// F(t) = R·t²/(2T): 4 by 2 s, plus the bucket's one
		if n := count(0, 2*time.Second); n > 6 {
			t.Errorf("%d sends in the first 2 s, want ≤ 6 (warming up; 40 at the full rate)", n)
		}
		if n := count(14*time.Second, 15*time.Second); n < 19 || n > 20 {
			t.Errorf("%d sends in the 15th second, want 19–20 (warm: 1.01 s / 20)", n)
		}
	})
}

// TestAutoWarmupKeepsPerSecondLimit: while the warm-up bucket, not the
// pacer, decides when a call goes, the pacer's interval still counts from
// the send: any RPS + 1 sends in a row span at least a second plus the
// guard (autoSecondGuard), through the warm-up and after it, so send jitter
// below the guard cannot put RPS + 1 of them in one second of the
// provider's.
func TestAutoWarmupKeepsPerSecondLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rps = 20
		g := NewGovernor(StrategyAuto, Limits{RPS: rps, Warmup: 10 * time.Second, MaxConcurrency: 100})
		req := Request{InputTokens: 10, MaxTokens: 10}
		t0 := time.Now()
		var sends []time.Time
		for time.Since(t0) < 20*time.Second {
			p, err := g.Acquire(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			sends = append(sends, time.Now())
			p.Settle(Result{PromptTokens: 10, CompletionTokens: 10, Latency: time.Millisecond})
		}
		for k := 0; k+rps < len(sends); k++ {
			// the guard less a nanosecond: waits round up to the nanosecond
			if span := sends[k+rps].Sub(sends[k]); span < time.Second+autoSecondGuard-time.Microsecond {
				t.Fatalf("%d sends from %v span %v, want ≥ 1s + %v", rps+1, sends[k].Sub(t0), span, autoSecondGuard)
			}
		}
	})
}
