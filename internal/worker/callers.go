package worker

import (
	"sync"
	"sync/atomic"
	"time"
)

// callerIdle is how long a goroutine whose call finished waits for the
// next one before it ends: long enough to span the gaps of a steady
// stream, short enough that a burst's goroutines do not stay for good.
const callerIdle = 10 * time.Second

// callers runs the calls the dispatchers admit. A call's goroutine grows
// its stack through net/http's round trip; a goroutine started for each
// call grew it again every time (runtime.copystack was ~4% of the
// consumer's CPU in the side-by-side profile, BENCHMARKS.md), so one whose
// call finished waits up to callerIdle for the next, its stack as grown.
type callers struct {
	work chan func()
	stop chan struct{}
	idle time.Duration
	wg   sync.WaitGroup
	// started counts the goroutines run started.
	started atomic.Int64
}

func newCallers(idle time.Duration) *callers {
	return &callers{work: make(chan func()), stop: make(chan struct{}), idle: idle}
}

// run runs f on a waiting goroutine, or on a new one when none waits.
func (c *callers) run(f func()) {
	select {
	case c.work <- f:
	default:
		c.wg.Add(1)
		c.started.Add(1)
		go c.loop(f)
	}
}

func (c *callers) loop(f func()) {
	defer c.wg.Done()
	// The collector halves a goroutine's stack when less than a quarter of
	// it is in use, and a waiting caller uses little: every collection
	// shrank the stacks the calls had grown, and the next call grew them
	// again (runtime.copystack, 5% of the consumer's CPU with the
	// goroutines kept; BENCHMARKS.md, "A caller's stack kept"). keep holds
	// a quarter of the stack a call grows to in use while the goroutine
	// waits, so the collector leaves that stack as it is.
	var keep [callerStackKept]byte
	holdStack(&keep)
	idle := time.NewTimer(c.idle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(c.idle)
		select {
		case f = <-c.work:
		case <-idle.C:
			return
		case <-c.stop:
			return
		}
	}
}

// callerStackKept is a quarter of the 32 KB stack a provider call grows
// to: the collector shrinks a stack only below a quarter in use.
const callerStackKept = 8 << 10

// holdStack keeps its argument on the caller's stack: a pointer the
// compiler sees go nowhere, to a function it cannot inline away.
//
//go:noinline
func holdStack(*[callerStackKept]byte) {}

// close ends the waiting goroutines and waits until they have. It is
// called once nothing calls run any more and every call has returned.
func (c *callers) close() {
	close(c.stop)
	c.wg.Wait()
}
