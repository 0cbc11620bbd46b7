package flow

import (
	"math"
	"testing"
	"time"
)

// observeN feeds n settled calls with outputs cycling through outs.
func observeN(c *Calibrator, n int, outs ...int) {
	for i := range n {
		c.Observe(100, 700, 130, outs[i%len(outs)], time.Duration(100+i%7)*time.Millisecond)
	}
}

// TestCalibrationExportImport: a cold calibrator that imports a warm one's
// calibration books as the warm one does, and both stay equal as the same
// calls settle in each: the window continues where it was.
func TestCalibrationExportImport(t *testing.T) {
	for _, n := range []int{5, outputWindow, 3*outputWindow + 17} {
		warm := NewCalibrator()
		observeN(warm, n, 30, 600, 30, 90)
		cold := NewCalibrator()
		if !cold.Import(warm.Export()) {
			t.Fatalf("n=%d: cold calibrator refused a warm calibration", n)
		}
		for step := range 3 {
			wi, wo, wd, ws := warm.Booking(100, 600)
			ci, co, cd, cs := cold.Booking(100, 600)
			if wi != ci || wo != co || math.Abs(wd-cd) > 1e-9 || ws != cs {
				t.Fatalf("n=%d step %d: booking warm (%v %v %v %v) vs imported (%v %v %v %v)", n, step, wi, wo, wd, ws, ci, co, cd, cs)
			}
			if w, c := warm.Snapshot(), cold.Snapshot(); math.Abs(w.OutputMean-c.OutputMean) > 1e-9 || w.Samples != c.Samples || w.InputRatio != c.InputRatio {
				t.Fatalf("n=%d step %d: snapshot %+v vs %+v", n, step, w, c)
			}
			if w, c := warm.Survival(), cold.Survival(); len(w.lat) != len(c.lat) {
				t.Fatalf("n=%d step %d: survival tables differ: %d vs %d points", n, step, len(w.lat), len(c.lat))
			}
			observeN(warm, 40, 1000)
			observeN(cold, 40, 1000)
		}
	}
}

// TestCalibrationImportKeepsOwn: a calibrator keeps its own calibration
// when it has seen as many calls, and refuses calibrations Observe could
// not have produced.
func TestCalibrationImportKeepsOwn(t *testing.T) {
	own := NewCalibrator()
	observeN(own, 50, 200)
	other := NewCalibrator()
	observeN(other, 50, 900)
	if own.Import(other.Export()) {
		t.Fatal("imported a calibration with no more samples than its own")
	}
	if got := own.Snapshot().OutputMean; got != 200 {
		t.Fatalf("own output mean changed to %v", got)
	}

	good := NewCalibrator()
	observeN(good, 60, 300)
	bad := map[string]func(*Calibration){
		"NaN ratio":        func(c *Calibration) { c.InputRatio = math.NaN() },
		"ratio too large":  func(c *Calibration) { c.InputRatio = 50 },
		"negative output":  func(c *Calibration) { c.Outputs[3] = -1 },
		"infinite latency": func(c *Calibration) { c.Latencies[0] = math.Inf(1) },
		"short latencies":  func(c *Calibration) { c.Latencies = c.Latencies[1:] },
		"window too short": func(c *Calibration) { c.Outputs, c.Latencies = c.Outputs[:10], c.Latencies[:10] },
		"no samples":       func(c *Calibration) { c.Samples, c.Outputs, c.Latencies = 0, nil, nil },
	}
	for name, spoil := range bad {
		cal := good.Export()
		spoil(&cal)
		if NewCalibrator().Import(cal) {
			t.Errorf("%s: imported", name)
		}
	}
}

// TestRateCapAdopt: a cap adopts a lower scale and recovers from it, and
// ignores one above its own.
func TestRateCapAdopt(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := NewRateCap(t0)
	c.Adopt(t0, 0.5)
	if got := c.Scale(t0); got != 0.5 {
		t.Fatalf("adopted scale %v, want 0.5", got)
	}
	if got := c.Spacing(t0, 10*time.Millisecond); got != 20*time.Millisecond {
		t.Fatalf("spacing at scale 0.5: %v", got)
	}
	c.Adopt(t0, 0.8)
	if got := c.Scale(t0); got != 0.5 {
		t.Fatalf("a higher scale was adopted: %v", got)
	}
	c.Adopt(t0, math.NaN())
	if got := c.Scale(t0.Add(time.Minute)); got <= 0.5 {
		t.Fatalf("no recovery a minute after adopting: %v", got)
	}
}
