package ratecontrol

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Calls that succeed without usage (task jobs: the slot is a running
// task, the call lasts the task) still drive auto's controller: the
// concurrency limit climbs from its cold start to max_concurrency, which
// the quota's Little's-law ceiling (5/s × 2 s) allows.
func TestAutoControllerLearnsFromCallsWithoutUsage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGovernor(StrategyAuto, Limits{RPM: 300, MaxConcurrency: 8, Warmup: -1})
		start := g.Snapshot().ConcurrencyLimit
		if start >= 8 {
			t.Fatalf("cold start at %d: the test needs one below max_concurrency", start)
		}
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for range 10 {
					p, err := g.Acquire(t.Context(), Request{})
					if err != nil {
						t.Error(err)
						return
					}
					time.Sleep(2 * time.Second)
					p.Settle(Result{Class: Classification{Kind: KindOK, Status: 200}, Latency: 2 * time.Second})
				}
			})
		}
		wg.Wait()
		if got := g.Snapshot().ConcurrencyLimit; got != 8 {
			t.Fatalf("concurrency limit %d after 160 calls without usage (started at %d), want max_concurrency 8", got, start)
		}
	})
}

// WithFullStart starts auto's concurrency at max_concurrency (a task
// model's running-task limit) instead of its cold start.
func TestAutoFullStart(t *testing.T) {
	lim := Limits{RPM: 300, MaxConcurrency: 8, Warmup: -1}
	if got := NewGovernor(StrategyAuto, lim).Snapshot().ConcurrencyLimit; got >= 8 {
		t.Fatalf("cold start %d: the test needs one below max_concurrency", got)
	}
	if got := NewGovernor(StrategyAuto, lim, WithFullStart()).Snapshot().ConcurrencyLimit; got != 8 {
		t.Fatalf("full start at %d, want max_concurrency 8", got)
	}
}
