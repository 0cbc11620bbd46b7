package ratecontrol

import (
	"context"
	"fmt"
	"time"
)

// Pause closes admission for d without treating it as a 429: the quota
// coordinator pauses a governor whose share is 0 (a replica that has not
// had its first round, or one the others' shares leave no room for), and
// renews the pause each round while it lasts. Callers waiting on it wake
// at Resume. Strategies without an adaptive controller (ratelimit,
// shaping) have nothing to pause: start their work after the
// coordinator's Ready.
func (g *Governor) Pause(d time.Duration) {
	pl, now := g.pl.Load(), g.now()
	if pl.ctl != nil {
		pl.ctl.Hold(now, now.Add(d))
	}
}

// Resume ends a pause at once, so a replica whose first round gave it a
// share sends from that round on, not when the pause would have lapsed
// (3.5 s with the coordinator's defaults). A drain a 429 began is kept.
func (g *Governor) Resume() {
	pl := g.pl.Load()
	if pl.ctl == nil || !pl.ctl.Release(g.now()) {
		return
	}
	g.wakeMu.Lock()
	if g.resumed != nil {
		close(g.resumed)
		g.resumed = nil
	}
	g.wakeMu.Unlock()
}

// resumedChan is closed at the next Resume that ends a pause.
func (g *Governor) resumedChan() <-chan struct{} {
	g.wakeMu.Lock()
	defer g.wakeMu.Unlock()
	if g.resumed == nil {
		g.resumed = make(chan struct{})
	}
	return g.resumed
}

// awaitDrain waits while the adaptive controller drains after a 429 or is
// paused (its slow-start restart after idle happens here too) and returns
// the time after the wait.
func (g *Governor) awaitDrain(ctx context.Context, pl *pipeline, now time.Time) (time.Time, error) {
	if pl.ctl == nil {
		return now, nil
	}
	for w := pl.ctl.Admit(now); w > 0; w = pl.ctl.Admit(now) {
		woken := g.resumedChan()
		t := time.NewTimer(w)
		select {
		case <-ctx.Done():
			t.Stop()
			return now, fmt.Errorf("ratecontrol: wait for drain cooldown: %w", ctx.Err())
		case <-t.C:
		case <-woken:
			t.Stop()
		}
		now = g.now()
	}
	return now, nil
}
