package ratecontrol

import (
	"testing"
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
	cal, rate := fresh.Adopt(learned)
	if !cal || !rate {
		t.Fatalf("fresh governor adopted calibration %v, rate %v", cal, rate)
	}
	if w, f := warm.Snapshot().Calibration, fresh.Snapshot().Calibration; w != f {
		t.Fatalf("calibration %+v, adopted %+v", w, f)
	}
	if got := fresh.Learned().RateScale; got < 0.5 || got > 0.51 {
		t.Fatalf("rate scale after adopting 0.5: %v", got)
	}

	if cal, _ := warm.Adopt(fresh.Learned()); cal {
		t.Fatal("a governor with as many samples replaced its calibration")
	}
	shaping := NewGovernor(StrategyShaping, lim)
	if cal, rate := shaping.Adopt(learned); !cal || rate {
		t.Fatalf("shaping adopted calibration %v, rate %v (it has no rate cap)", cal, rate)
	}
}
