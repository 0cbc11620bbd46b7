package flow

import (
	"testing"
	"time"
)

func TestControllerDrainAndRecover(t *testing.T) {
	t0 := time.Unix(0, 0)
	c := NewController(ControllerConfig{Initial: 20, Max: 100}, t0)
	c.OnRateLimit(t0, t0, 0)
	if s := c.Snapshot(); s.State != StateDrain || c.Limit() != 14 {
		t.Fatalf("after 429: %v limit %d, want drain 14", s.State, c.Limit())
	}
	// A 429 of a call sent before the cut does not cut again.
	c.OnRateLimit(t0.Add(10*time.Millisecond), t0.Add(-time.Second), 0)
	if c.Limit() != 14 {
		t.Fatalf("second 429 cut again: %d", c.Limit())
	}
	if w := c.Admit(t0.Add(500 * time.Millisecond)); w != 510*time.Millisecond {
		t.Fatalf("admit during drain waits %v, want the rest of the 1s cooldown", w)
	}
	now := t0.Add(2 * time.Second)
	if w := c.Admit(now); w != 0 || c.Snapshot().State != StateProbing {
		t.Fatalf("after cooldown: wait %v state %v", w, c.Snapshot().State)
	}
	rounds := 0
	for c.Limit() < 20 {
		rounds++
		n := c.Limit()
		for range n {
			now = now.Add(50 * time.Millisecond)
			c.OnSuccess(now, time.Second, 100, 300, n)
		}
		if rounds > 10 {
			t.Fatalf("no recovery to 20 after 10 rounds: %d", c.Limit())
		}
	}
	t.Logf("recovered from 14 to %d in %d rounds", c.Limit(), rounds)
	// Retry-After extends the cooldown.
	c.OnRateLimit(now, now, 5*time.Second)
	if w := c.Admit(now); w != 5*time.Second {
		t.Fatalf("retry-after cooldown %v", w)
	}
}

func TestControllerHoldOnTPT(t *testing.T) {
	t0 := time.Unix(0, 0)
	c := NewController(ControllerConfig{Initial: 10, Max: 100}, t0)
	now := t0
	feed := func(lat time.Duration, n int) {
		for range n {
			now = now.Add(10 * time.Millisecond)
			c.OnSuccess(now, lat, 200, 400, 10)
		}
	}
	feed(2*time.Second, 30) // 10 ms per token
	if s := c.Snapshot(); s.State != StateProbing {
		t.Fatalf("state %v", s.State)
	}
	feed(2*time.Second+6*time.Second, 3) // TPT ×4: congestion
	s := c.Snapshot()
	if s.State != StateHold {
		t.Fatalf("state %v after slow tokens, want hold", s.State)
	}
	held := c.Limit()
	feed(8*time.Second, 30) // a full round in HOLD does not grow
	if c.Limit() != held && c.Snapshot().State == StateHold {
		t.Fatalf("limit moved in hold: %d → %d", held, c.Limit())
	}
	// Noise guard: short answers (< 16 tokens) do not feed TPT.
	c2 := NewController(ControllerConfig{Initial: 10}, t0)
	for i := range 20 {
		c2.OnSuccess(t0.Add(time.Duration(i)*time.Second), time.Duration(1+i%5)*time.Second, 3, 200, 10)
	}
	if c2.Snapshot().State != StateProbing || c2.Snapshot().EMATPT != 0 {
		t.Fatalf("short answers fed TPT: %+v", c2.Snapshot())
	}
}

func TestControllerSlowStartRestartAndCeiling(t *testing.T) {
	t0 := time.Unix(0, 0)
	c := NewController(ControllerConfig{Initial: 4, Max: 200, QuotaRPS: 10}, t0)
	now := t0
	for range 200 { // 1 s calls at 10 rps quota: ceiling ≈ 10 × 1 s × 1.2
		n := c.Limit()
		for range n {
			now = now.Add(10 * time.Millisecond)
			c.OnSuccess(now, time.Second, 100, 300, n)
		}
	}
	if l := c.Limit(); l > 13 || l < 10 {
		t.Fatalf("limit %d, want at the Little's-law ceiling ≈ 12", l)
	}
	c.Admit(now.Add(2 * time.Minute)) // idle for 4 restart periods
	if l := c.Limit(); l > 6 {
		t.Fatalf("after idle limit %d, want decayed toward the initial 4", l)
	}
	if c.Snapshot().Restarts != 1 {
		t.Fatal("restart not counted")
	}
}
