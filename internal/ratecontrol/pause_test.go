package ratecontrol

import (
	"testing"
	"testing/synctest"
	"time"
)

// A caller waiting on a pause goes at Resume, not when the pause would
// have lapsed; Pause cuts nothing.
func TestGovernorResumeWakesPausedCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGovernor(StrategyAuto, Limits{})
		limit := g.Snapshot().ConcurrencyLimit
		g.Pause(time.Hour)
		start := time.Now()
		done := make(chan time.Duration)
		go func() {
			p, err := g.Acquire(t.Context(), Request{})
			if err != nil {
				t.Error(err)
				close(done)
				return
			}
			p.Cancel()
			done <- time.Since(start)
		}()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("a paused governor admitted a call")
		default:
		}
		g.Resume()
		if waited := <-done; waited != 2*time.Second {
			t.Fatalf("admitted after %v, want at Resume (2s)", waited)
		}
		if got := g.Snapshot().ConcurrencyLimit; got != limit {
			t.Fatalf("concurrency limit %d after a pause, want %d: a pause is no 429", got, limit)
		}
	})
}

// A Resume that lands between a paused caller's look at the pause and its
// wait still wakes it: the caller waits on the channel it took before it
// looked, which that Resume closes.
func TestGovernorResumeRightAfterTheLookWakesTheCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGovernor(StrategyRateLimit, Limits{})
		g.Pause(time.Hour)
		looks := 0
		admit := func(now time.Time) time.Duration {
			w := g.held(now)
			if looks++; looks == 2 { // the look right before the wait
				g.Resume()
			}
			return w
		}
		start := time.Now()
		if _, err := g.waitAdmitted(t.Context(), start, admit); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("woke after %v, want at the Resume (0s)", waited)
		}
	})
}
