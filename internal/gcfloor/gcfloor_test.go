package gcfloor

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercentPutsTheGoalAtTheFloor(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, floor uint64
		want        int
	}{
		{live: 16 * mib, floor: 64 * mib, want: 300},   // goal 16 × 4 = 64
		{live: 10 * mib, floor: 64 * mib, want: 540},   // goal 10 × 6.4 = 64
		{live: 32 * mib, floor: 64 * mib, want: 100},   // 2 × live reaches the floor already
		{live: 200 * mib, floor: 64 * mib, want: 100},  // a large heap behaves as GOGC=100
		{live: 1 * mib, floor: 64 * mib, want: 1000},   // capped
		{live: 0, floor: 64 * mib, want: 100},          // nothing read yet
		{live: 30 * mib, floor: 64 * mib, want: 113},   // rounds down: the goal never passes the floor
		{live: 16 * mib, floor: 256 * mib, want: 1000}, // capped again
	} {
		if got := Percent(c.live, c.floor); got != c.want {
			t.Errorf("Percent(%d MiB, %d MiB) = %d, want %d", c.live/mib, c.floor/mib, got, c.want)
		}
	}
}

// Run sets a percent above the default while the heap is small and gives
// the default back when its context ends. Not parallel: the GC percent is
// the process's.
func TestRunRaisesThePercentAndRestoresIt(t *testing.T) {
	t.Setenv("GOGC", "") // restores the variable when the test ends
	os.Unsetenv("GOGC")
	runtime.GC() // the live heap reads 0 until a cycle has ended
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Run(ctx, 1<<40); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	var seen int
	for time.Now().Before(deadline) {
		seen = gcPercent()
		if seen == maxPercent {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if seen != maxPercent {
		t.Fatalf("GC percent while Run held a 1 TiB floor = %d, want %d", seen, maxPercent)
	}
	if p := gcPercent(); p != 100 {
		t.Fatalf("GC percent after Run returned = %d, want 100", p)
	}
}

func TestRunLeavesAnOperatorsGOGCAlone(t *testing.T) {
	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150)
	defer debug.SetGCPercent(100)
	Run(context.Background(), 1<<40) // returns at once, or the test times out
	if p := gcPercent(); p != 150 {
		t.Fatalf("GC percent with GOGC=150 set = %d, want 150", p)
	}
}

func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}
