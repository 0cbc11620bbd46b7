package ratecontrol

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestAutoSendsWaitsBelowTheTimerFloorAtOnce: at 10,000 requests a second
// the pacer's slots are 100 µs apart, shorter than a timer can sleep. Auto
// sends such a call at once instead of sleeping a millisecond for it while
// every other caller waits behind the head (which capped a governor near
// 2,000 sends a second whatever its limits), but books it at its slot: the
// schedule keeps the interval, and a wait of the floor or more still
// sleeps. In virtual time, so the clock shows exactly which calls slept.
func TestAutoSendsWaitsBelowTheTimerFloorAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rps = 10_000
		g := NewGovernor(StrategyAuto, Limits{RPS: rps, Warmup: -1})
		req := Request{InputTokens: 10, MaxTokens: 10}
		t0 := time.Now()
		interval := time.Second / rps
		n := int(timerFloor/interval) + 5
		var slots []time.Time
		var clock []time.Duration // virtual time when each call was let go
		for range n {
			p, err := g.Acquire(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			slots = append(slots, p.SentAt())
			clock = append(clock, time.Since(t0))
			p.Settle(Result{PromptTokens: 10, CompletionTokens: 10, Latency: time.Millisecond})
		}
		for i := range slots {
			slot := slots[i].Sub(t0)
			if i > 0 && slots[i].Sub(slots[i-1]) < interval {
				t.Fatalf("send %d booked %v after send %d, want at least the interval %v", i, slots[i].Sub(slots[i-1]), i-1, interval)
			}
			if clock[i] > slot || clock[i] < slot-timerFloor {
				t.Fatalf("send %d booked at %v went at %v, want at most the timer floor %v early and never late", i, slot, clock[i], timerFloor)
			}
			if slot < timerFloor && clock[i] != 0 {
				t.Fatalf("send %d booked %v ahead slept until %v; a wait below the timer floor %v should go at once", i, slot, clock[i], timerFloor)
			}
		}
		if last := slots[n-1].Sub(t0); clock[n-1] == 0 || last < timerFloor {
			t.Fatalf("the last of %d sends booked at %v went at %v; want a booking beyond the floor, and a sleep for it", n, last, clock[n-1])
		}
	})
}

// TestAutoKeepsItsRampWhenTheHeadWakesLate: on a busy host the head
// caller's timer wakes milliseconds late. A request bucket of one request
// dropped what the ramp issued meanwhile, and a warm-up at thousands of
// requests a second sent far below its rate. Here the caller is held up
// 3 ms after every tenth send (as a late timer holds it) during a 10 s ramp
// to 5,000 requests a second: the sends in [2 s, 3 s) must be what the ramp
// issues there (1,000 to 1,500 a second), within a few percent. The
// caller's own stalls let it send up to ~3,300 a second, so it can keep
// up. In virtual time, so the only lateness is the one the test makes.
func TestAutoKeepsItsRampWhenTheHeadWakesLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rps = 5_000
		const warmup = 10 * time.Second
		g := NewGovernor(StrategyAuto, Limits{RPM: rps * 60, Warmup: warmup})
		from, to := 2*time.Second, 3*time.Second
		sent := sentWithin(sendStalling(t, g, to, 10, 3*time.Millisecond), from, to)
		// The ramp issues F(t) = R·t²/(2T) by t.
		issued := func(d time.Duration) float64 {
			s := d.Seconds()
			return rps * s * s / (2 * warmup.Seconds())
		}
		want := issued(to) - issued(from)
		t.Logf("sent %d in [%v, %v), the ramp issued %.0f", sent, from, to, want)
		if float64(sent) < 0.97*want {
			t.Fatalf("sent %d in [%v, %v) of a ramp that issues %.0f there; want within 3%% below", sent, from, to, want)
		}
	})
}

// TestAutoKeepsItsRateWhenTheHeadWakesLate: once warm, the pacer binds,
// and a head that woke late used to lose its lateness at every wake: on a
// busy host auto sent 80% of 10,000 requests a second. A caller held up
// after some of its sends (as a late timer holds it: 3 ms every tenth send,
// or 4.9 ms, nearly the whole lateness made up, every 97th) must still send
// at the pacer's rate, and never more than before in any second: RPM/60 +
// 1 for a minute limit (the +1 of a send up to the timer floor early), RPS
// for a per-second one. In virtual time.
func TestAutoKeepsItsRateWhenTheHeadWakesLate(t *testing.T) {
	for _, c := range []struct {
		name  string
		lim   Limits
		most  int // sends in any second
		every int
		stall time.Duration
	}{
		{"rpm", Limits{RPM: 60_000, Warmup: -1}, 1001, 10, 3 * time.Millisecond},
		{"rpm_long_stall", Limits{RPM: 60_000, Warmup: -1}, 1001, 97, 4900 * time.Microsecond},
		{"rps", Limits{RPS: 1000, Warmup: -1}, 1000, 10, 3 * time.Millisecond},
		{"rps_long_stall", Limits{RPS: 1000, Warmup: -1}, 1000, 97, 4900 * time.Microsecond},
		// an RPS rule just above RPM/60 does not bind, and must hold too
		{"rps_above_rpm", Limits{RPM: 60_000, RPS: 1002, Warmup: -1}, 1001, 97, 4900 * time.Microsecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewGovernor(StrategyAuto, c.lim)
				rate := float64(time.Second) / float64(g.pacerInterval(c.lim))
				at := sendStalling(t, g, 3*time.Second, c.every, c.stall)
				sent := sentWithin(at, 2*time.Second, 3*time.Second)
				if float64(sent) < 0.97*rate {
					t.Fatalf("sent %d in [2s, 3s), want at least 97%% of the pacer's %.0f", sent, rate)
				}
				most := 0
				for i, j := 0, 0; j < len(at); j++ {
					for at[j]-at[i] >= time.Second {
						i++
					}
					if j-i+1 > c.most {
						t.Fatalf("%d sends within a second ending at %v, want at most %d", j-i+1, at[j], c.most)
					}
					most = max(most, j-i+1)
				}
				t.Logf("sent %d in [2s, 3s) at a pacer's %.0f a second, at most %d in a second", sent, rate, most)
			})
		})
	}
}

// sendStalling sends through g from one caller until the virtual clock
// reaches until, sleeping stall after every every-th send (as a timer that
// wakes late holds the head), and returns when each send went, from the
// start.
func sendStalling(t *testing.T, g *Governor, until time.Duration, every int, stall time.Duration) []time.Duration {
	t.Helper()
	req := Request{InputTokens: 10, MaxTokens: 10}
	res := Result{PromptTokens: 10, CompletionTokens: 10, Latency: time.Millisecond}
	t0 := time.Now()
	var at []time.Duration
	for i := 0; time.Since(t0) < until; i++ {
		p, err := g.Acquire(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		at = append(at, time.Since(t0))
		p.Settle(res)
		if i%every == every-1 {
			time.Sleep(stall)
		}
	}
	return at
}

// sentWithin counts the sends in [from, to).
func sentWithin(at []time.Duration, from, to time.Duration) int {
	n := 0
	for _, a := range at {
		if a >= from && a < to {
			n++
		}
	}
	return n
}
