package flow

import (
	"math"
	"testing"
	"time"
)

// TestSurvivalTable: calls that outlive the short answers are the long ones.
func TestSurvivalTable(t *testing.T) {
	c := NewCalibrator()
	if _, ok := c.Survival().OutputGivenAge(0); ok {
		t.Fatal("table before any sample")
	}
	for i := range 100 {
		out := 100
		if i%4 == 0 {
			out = 1000
		}
		lat := 300*time.Millisecond + time.Duration(out)*20*time.Millisecond
		c.Observe(100, 200, 100, out, lat)
	}
	st := c.Survival()
	// 75 answers of 100 tokens (2.3 s), 25 of 1,000 (20.3 s)
	for _, tc := range []struct {
		age       time.Duration
		want, vrc float64
	}{{0, 325, 151_875}, {2 * time.Second, 325, 151_875}, {3 * time.Second, 1000, 0},
		{19 * time.Second, 1000, 0}, {time.Minute, 1000, 0}} {
		o, ok := st.OutputGivenAge(tc.age)
		if !ok || math.Abs(o.Mean-tc.want) > 1e-9 || math.Abs(o.Variance-tc.vrc) > 1e-6 || o.Max != 1000 {
			t.Errorf("age %v: %+v, want mean %v variance %v largest 1000", tc.age, o, tc.want, tc.vrc)
		}
	}
}
