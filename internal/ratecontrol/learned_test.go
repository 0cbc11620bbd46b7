package ratecontrol

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// TestGovernorAdopt: a new governor takes a warm one's calibration and a
// lowered rate cap; one that has seen more calls, or a strategy without a
// rate cap, keeps its own.
func TestGovernorAdopt(t *testing.T) {
	lim := Limits{RPM: 600, TPM: 100_000}
	warm := NewGovernor(StrategyAuto, lim)
	for i := range 200 {
		warm.cal.Observe(100, 700, 120, 30+i%5*100, 200*time.Millisecond)
	}
	learned := warm.Learned()
	if learned.RateScale != 1 || learned.Calibration.Samples != 200 {
		t.Fatalf("learned %+v", learned)
	}
	learned.RateScale = 0.5

	fresh := NewGovernor(StrategyAuto, lim)
	cal, rate, _ := fresh.Adopt(learned)
	if !cal || !rate {
		t.Fatalf("fresh governor adopted calibration %v, rate %v", cal, rate)
	}
	if w, f := warm.Snapshot().Calibration, fresh.Snapshot().Calibration; w != f {
		t.Fatalf("calibration %+v, adopted %+v", w, f)
	}
	if got := fresh.Learned().RateScale; got < 0.5 || got > 0.51 {
		t.Fatalf("rate scale after adopting 0.5: %v", got)
	}

	if cal, _, _ := warm.Adopt(fresh.Learned()); cal {
		t.Fatal("a governor with as many samples replaced its calibration")
	}
	shaping := NewGovernor(StrategyShaping, lim)
	if cal, rate, _ := shaping.Adopt(learned); !cal || rate {
		t.Fatalf("shaping adopted calibration %v, rate %v (it has no rate cap)", cal, rate)
	}
}

// TestGovernorAdoptWarmth: a governor that has sent through half its
// warm-up reports warmth 0.5; a new one adopting it sends at half the
// rate from its first second instead of ramping from zero, and one that
// adopts nothing (a cold fleet) ramps from zero as before. In virtual time.
func TestGovernorAdoptWarmth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := Limits{RPM: 6000, TPM: 1e9, Warmup: 20 * time.Second} // 100 requests a second once warm
		req := Request{InputTokens: 10, MaxTokens: 10}
		res := Result{PromptTokens: 10, CompletionTokens: 10, Latency: time.Millisecond}
		sendsInOneSecond := func(g *Governor) int {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			n := 0
			for {
				p, err := g.Acquire(ctx, req)
				if err != nil {
					return n
				}
				p.Settle(res)
				n++
			}
		}

		old := NewGovernor(StrategyAuto, lim)
		if w := old.Learned().Warmth; w != 0 {
			t.Fatalf("warmth of a governor that never sent = %v, want 0", w)
		}
		time.Sleep(9 * time.Second)
		sendsInOneSecond(old) // sends from 9 s to 10 s: half-way through the ramp
		offered := old.Learned()
		if w := offered.Warmth; w < 0.49 || w > 0.51 {
			t.Fatalf("warmth 10 s into a 20 s warm-up = %v, want 0.5", w)
		}

		cold := NewGovernor(StrategyAuto, lim)
		coldSends := sendsInOneSecond(cold)
		joined := NewGovernor(StrategyAuto, lim)
		if _, _, warm := joined.Adopt(offered); !warm {
			t.Fatal("a new governor did not take warmth 0.5")
		}
		joinedSends := sendsInOneSecond(joined)
		// Over its first second a cold ramp issues 100·1²/(2·20) = 2.5
		// requests; one that starts at 50/s issues 50 + 2.5.
		if coldSends > 5 {
			t.Fatalf("a cold governor sent %d in its first second, want about 3", coldSends)
		}
		if joinedSends < 50 || joinedSends > 55 {
			t.Fatalf("a governor warm-started at 0.5 sent %d in its first second, want about 52", joinedSends)
		}
		if _, _, warm := joined.Adopt(Learned{Warmth: 0.2}); warm {
			t.Fatal("a governor further warmed up took a lower warmth")
		}

		noWarmup := NewGovernor(StrategyAuto, Limits{RPM: 6000, TPM: 1e9, Warmup: -1})
		sendsInOneSecond(noWarmup)
		if w := noWarmup.Learned().Warmth; w != 0 {
			t.Fatalf("warmth of a governor without a warm-up = %v, want 0 (nothing to tell)", w)
		}
	})
}
