package ratecontrol

import (
	"testing"
	"time"
)

// TestAgingChargesALongCallBeforeItSettles: once a call has outlived the
// short answers, auto charges it as a long one.
func TestAgingChargesALongCallBeforeItSettles(t *testing.T) {
	g := NewGovernor(StrategyAuto, Limits{TPM: 1e6, Warmup: -1})
	now := time.Unix(0, 0)
	g.now = func() time.Time { return now }
	acquire := func() *Permit {
		p, err := g.Acquire(t.Context(), Request{InputTokens: 100, MaxTokens: 2000})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for i := range 64 { // history: 3 short answers to 1 long
		out := 100
		if i%4 == 0 {
			out = 1000
		}
		acquire().Settle(Result{PromptTokens: 100, CompletionTokens: out,
			Latency: 300*time.Millisecond + time.Duration(out)*20*time.Millisecond})
		now = now.Add(time.Second)
	}
	p := acquire()
	booked := g.Snapshot().InFlightTokens
	now = now.Add(5 * time.Second) // outlived every short answer
	q := acquire()                 // admissions age the calls in flight
	aged := g.Snapshot().InFlightTokens - q.BookedTokens()
	if want := booked - p.BookedTokens() + 100 + 1000; aged < want-1 {
		t.Fatalf("in flight after aging %.0f tokens, want ≥ %.0f (the long call as 100 + 1000)", aged, want)
	}
	p.Settle(Result{PromptTokens: 100, CompletionTokens: 1000})
	q.Settle(Result{PromptTokens: 100, CompletionTokens: 100})
	if s := g.Snapshot(); s.InFlightTokens > 1e-6 || s.InFlightTokens < -1e-6 {
		t.Fatalf("in flight after settling everything %v", s.InFlightTokens)
	}
}
