package sim

import (
	"context"
	"time"
)

// Clock is the simulator's time source. Limits read Now; latency, the
// wait-timeout queue and hanging faults wait on After. The default is the
// time package, which is virtual inside a testing/synctest bubble.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// sleep waits d on the simulator's clock; it returns false early when ctx
// ends or the simulator closes.
func (s *Simulator) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	select {
	case <-s.clock.After(d):
		return true
	case <-ctx.Done():
		return false
	case <-s.closed:
		return false
	}
}

// timing returns the time to first token and the time per output token for
// a request admitted while inflight requests (itself included) run: TPT
// grows in proportion to inflight/Capacity above Capacity.
func (l LatencyConfig) timing(inflight int64) (ttft, tpt time.Duration) {
	tpt = l.TPT.D()
	if l.Capacity > 0 && inflight > l.Capacity {
		tpt = time.Duration(float64(tpt) * float64(inflight) / float64(l.Capacity))
	}
	return l.TTFT.D(), tpt
}
