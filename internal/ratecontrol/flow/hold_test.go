package flow

import (
	"testing"
	"time"
)

// A hold closes admission without a cut and Release lifts it at once; a
// 429 during the hold makes it a drain that runs its course.
func TestControllerHoldAndRelease(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := NewController(ControllerConfig{Max: 100, Initial: 8}, now)
	c.Hold(now, now.Add(3*time.Second))
	if w := c.Admit(now); w != 3*time.Second {
		t.Fatalf("held: admission waits %v, want the hold's 3s", w)
	}
	if l := c.Limit(); l != 8 {
		t.Fatalf("limit %d after a hold, want 8: a hold is no cut", l)
	}
	now = now.Add(time.Second)
	if !c.Release(now) {
		t.Fatal("Release of a hold reported false")
	}
	if w := c.Admit(now); w != 0 {
		t.Fatalf("released: admission waits %v", w)
	}
	if c.Release(now) {
		t.Fatal("nothing left to release, Release reported true")
	}

	c.Hold(now, now.Add(3*time.Second))
	c.OnRateLimit(now, now, time.Second)
	if c.Release(now.Add(time.Millisecond)) {
		t.Fatal("a 429 in the hold: Release must leave the drain")
	}
	if w := c.Admit(now.Add(2 * time.Second)); w <= 0 {
		t.Fatal("the drain must last until the hold's end")
	}
	if w := c.Admit(now.Add(3 * time.Second)); w != 0 {
		t.Fatalf("after the hold's end: admission waits %v", w)
	}
}
