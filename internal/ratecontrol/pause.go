package ratecontrol

import (
	"context"
	"fmt"
	"time"
)

// Pause closes admission for d without treating it as a 429: the quota
// coordinator pauses a governor whose share is 0 (a replica that has not
// had its first round, one the others' shares leave no room for, or one
// failing closed), and renews the pause each round while it lasts.
// Callers waiting on it wake at Resume. A strategy without an adaptive
// controller (ratelimit, shaping) holds its callers before they book: a
// booking under a share of 0 would plan its wait under a quota of almost
// nothing and keep sleeping after the share came back.
//
// The pause is kept on the governor too, so that a pipeline SetLimits
// builds anew holds it as well.
func (g *Governor) Pause(d time.Duration) {
	pl, now := g.pl.Load(), g.now()
	g.wakeMu.Lock()
	g.heldUntil = now.Add(d)
	g.wakeMu.Unlock()
	if pl.ctl != nil {
		pl.ctl.Hold(now, now.Add(d))
	}
}

// Resume ends a pause at once, so a replica whose first round gave it a
// share sends from that round on, not when the pause would have lapsed
// (3.5 s with the coordinator's defaults). A drain a 429 began is kept.
func (g *Governor) Resume() {
	pl := g.pl.Load()
	g.wakeMu.Lock()
	wasHeld := !g.heldUntil.IsZero()
	g.heldUntil = time.Time{}
	g.wakeMu.Unlock()
	if pl.ctl != nil && !pl.ctl.Release(g.now()) || pl.ctl == nil && !wasHeld {
		return
	}
	if pl.pacer != nil {
		// A caller that took its slot during the pause booked the pacer
		// under the limits of share 0.
		pl.pacer.Pull(g.now())
	}
	// Auto's head caller, if it booked then, looks again at its send.
	pl.wake()
	g.wakeMu.Lock()
	if g.resumed != nil {
		close(g.resumed)
		g.resumed = nil
	}
	g.wakeMu.Unlock()
}

// rehold carries the governor's pause over to pl, a pipeline SetLimits
// built anew.
func (g *Governor) rehold(now time.Time, pl *pipeline) {
	g.wakeMu.Lock()
	until := g.heldUntil
	g.wakeMu.Unlock()
	if pl.ctl != nil && until.After(now) {
		pl.ctl.Hold(now, until)
	}
}

// held is how long a pause of a strategy without a controller still lasts
// at now (0: none).
func (g *Governor) held(now time.Time) time.Duration {
	g.wakeMu.Lock()
	defer g.wakeMu.Unlock()
	if g.heldUntil.IsZero() {
		return 0
	}
	return g.heldUntil.Sub(now)
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
	admit := g.held
	if pl.ctl != nil {
		admit = pl.ctl.Admit
	}
	return g.waitAdmitted(ctx, now, admit)
}

// waitAdmitted waits until admit has no wait left. The caller takes the
// wake-up channel before each look at admit: a Resume that lands after a
// look closes the channel the caller then waits on, where one taken after
// the look would be the next Resume's and the caller would sleep out the
// pause (3.5 s with the coordinator's defaults).
func (g *Governor) waitAdmitted(ctx context.Context, now time.Time, admit func(time.Time) time.Duration) (time.Time, error) {
	if admit(now) <= 0 {
		return now, nil // the usual case, without a wake-up channel
	}
	for {
		woken := g.resumedChan()
		w := admit(now)
		if w <= 0 {
			return now, nil
		}
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
}
