package ratecontrol

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// simProvider admits at most capacity calls at once; a call beyond it is
// answered 429 at once, as a provider's concurrency or RPS guard does.
type simProvider struct {
	mu       sync.Mutex
	capacity int
	inflight int
}

func (s *simProvider) call(r *rand.Rand) Result {
	s.mu.Lock()
	if s.inflight >= s.capacity {
		s.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		return Result{Class: Classification{Kind: KindRateLimit, Status: 429}, Latency: 20 * time.Millisecond}
	}
	s.inflight++
	s.mu.Unlock()
	lat := time.Duration((0.5 + r.Float64()) * float64(time.Second))
	time.Sleep(lat)
	s.mu.Lock()
	s.inflight--
	s.mu.Unlock()
	return Result{PromptTokens: 200, CompletionTokens: 100, Latency: lat}
}

func (s *simProvider) setCapacity(n int) {
	s.mu.Lock()
	s.capacity = n
	s.mu.Unlock()
}

// TestAdaptiveReconvergesWhenCapacityHalves: capacity 40 halves to 20 at
// minute 3; the concurrency limit must settle within [0.4, 1.25]×20 within
// 15 virtual seconds and stay there.
func TestAdaptiveReconvergesWhenCapacityHalves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		g := NewGovernor(StrategyAdaptive, Limits{MaxConcurrency: 100})
		sim := &simProvider{capacity: 40}
		ctx, cancel := context.WithDeadline(t.Context(), start.Add(5*time.Minute))
		defer cancel()
		type sample struct {
			at    time.Duration
			limit int
		}
		var samples []sample
		var wg sync.WaitGroup
		wg.Go(func() { // the monitor, and the capacity change at minute 3
			tick := time.NewTicker(250 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				at := time.Since(start)
				if at >= 3*time.Minute {
					sim.setCapacity(20)
				}
				samples = append(samples, sample{at, g.Snapshot().ConcurrencyLimit})
			}
		})
		for c := range 80 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(c), 3))
				for {
					p, err := g.Acquire(ctx, Request{InputTokens: 200, MaxTokens: 100})
					if err != nil {
						return
					}
					p.Settle(sim.call(r))
				}
			})
		}
		wg.Wait()
		in := func(l, c int) bool { return float64(l) >= 0.4*float64(c) && float64(l) <= 1.25*float64(c) }
		var before, settled time.Duration = -1, -1
		for _, s := range samples {
			if s.at >= 2*time.Minute && s.at < 3*time.Minute && !in(s.limit, 40) && before < 0 {
				before = s.at
			}
		}
		if before >= 0 {
			t.Errorf("limit left [16, 50] at %v before the capacity change", before)
		}
		for i := len(samples) - 1; i >= 0 && samples[i].at >= 3*time.Minute; i-- {
			if !in(samples[i].limit, 20) {
				settled = samples[i].at
				break
			}
		}
		if settled < 0 {
			settled = 3 * time.Minute
		}
		t.Logf("re-converged %v after the capacity halved; cuts %d", settled-3*time.Minute, g.Snapshot().Controller.Cuts)
		if settled-3*time.Minute > 15*time.Second {
			t.Errorf("limit last outside [8, 25] at %v: re-convergence took %v, want ≤ 15s", settled, settled-3*time.Minute)
		}
	})
}
