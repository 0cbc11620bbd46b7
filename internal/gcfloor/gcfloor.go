// Package gcfloor keeps the Go garbage collector from running more often
// than a small heap warrants.
//
// An llmq process keeps little alive (10–20 MiB for a consumer at a few
// thousand jobs a second) and throws away a lot: every job's request and
// response pass through pgx's parameter and wire buffers, which pgx drops
// after each statement. With GOGC=100 the collector then runs whenever
// the heap grows by its live size, dozens of times a second, and the
// marking and assists cost the consumer about a sixth of its CPU
// (BENCHMARKS.md, "the collector's share"). A floor under the heap goal
// is what the Go GC guide recommends for such a program: the goal becomes
// max(floor, 2 × live), so memory stays bounded by the floor while the
// live heap is small and behaves as GOGC=100 once it is large.
//
// The runtime has no floor setting (GOMEMLIMIT is a ceiling), so Run
// reads the live heap every second and sets the GC percent that puts the
// goal at the floor. A GOGC the operator set wins: Run then does nothing.
package gcfloor

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// maxPercent bounds the percent Run sets, so a live heap that shrinks to
// almost nothing does not make the next cycle wait for a floor's worth of
// garbage many times its size.
const maxPercent = 1000

// holding counts the Runs of this process (tests start several consumers
// in one): the GC percent is the process's, and the last Run to end gives
// the default back.
var holding struct {
	sync.Mutex
	n int
}

// Percent returns the GC percent that puts the heap goal, live × (1 +
// percent/100), at floor: never below Go's default of 100, never above
// maxPercent.
func Percent(live, floor uint64) int {
	if live == 0 || floor <= 2*live {
		return 100
	}
	p := (floor - live) * 100 / live
	return int(min(p, maxPercent))
}

// Run holds the heap goal at floor bytes or more until ctx ends, then
// gives the runtime back its default. It returns at once when floor is 0
// or the GOGC variable is set.
func Run(ctx context.Context, floor uint64) {
	if floor == 0 {
		return
	}
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	holding.Lock()
	holding.n++
	holding.Unlock()
	defer func() {
		holding.Lock()
		defer holding.Unlock()
		if holding.n--; holding.n == 0 {
			debug.SetGCPercent(100)
		}
	}()
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := -1
	for {
		metrics.Read(sample)
		if sample[0].Value.Kind() == metrics.KindUint64 {
			if p := Percent(sample[0].Value.Uint64(), floor); p != last {
				debug.SetGCPercent(p)
				last = p
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
