package flow

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestWindowLogNeverOverfillsAWindow drives a log with random bookings,
// settlements, refunds and rebookings of the waiting call and checks, at
// every booking and every move, the provider's view:
// the bookings in the window ending at the new booking's time, with every
// correction made so far, stay within the limit; bookings keep FIFO order.
func TestWindowLogNeverOverfillsAWindow(t *testing.T) {
	const limit = 10_000.0
	moves := 0
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 1))
		t0 := time.Unix(0, 0)
		w := NewWindowLog(time.Minute, limit)
		type booking struct {
			id uint64
			at time.Time
			n  float64
		}
		var log []booking
		now, last := t0, t0
		for range 3000 {
			now = now.Add(time.Duration(r.IntN(400)) * time.Millisecond)
			if len(log) > 0 && r.IntN(3) == 0 {
				// settle a recent booking: more or less than booked
				b := &log[len(log)-1-r.IntN(min(len(log), 20))]
				delta := float64(r.IntN(600) - 300)
				if b.n-delta < 0 {
					delta = b.n
				}
				w.adjustEntry(now, b.id, delta)
				if now.Sub(b.at) < time.Minute {
					b.n -= delta
				}
				continue
			}
			var at time.Time
			if k := len(log) - 1; k >= 0 && log[k].at.After(now) && r.IntN(2) == 0 {
				// the waiting call looks again after room was freed
				b := &log[k]
				at = now.Add(w.rebookEntry(now, now, b.id))
				if at.After(b.at) {
					t.Fatalf("seed %d: rebooking moved a booking later, %v → %v", seed, b.at, at)
				}
				if k > 0 && at.Before(log[k-1].at) {
					t.Fatalf("seed %d: rebooked at %v before the previous booking at %v", seed, at, log[k-1].at)
				}
				moved := at.Before(b.at)
				b.at = at
				if moved {
					moves++
				} else { // nothing new to check: corrections since may have filled its window
					continue
				}
			} else {
				n := float64(50 + r.IntN(900))
				wait, id := w.reserveEntry(now, now, n)
				at = now.Add(wait)
				if at.Before(last) {
					t.Fatalf("seed %d: booking at %v before the previous one at %v", seed, at, last)
				}
				log = append(log, booking{id: id, at: at, n: n})
			}
			last = at
			var inWindow float64
			for _, b := range log {
				if b.at.After(at.Add(-time.Minute)) && !b.at.After(at) {
					inWindow += b.n
				}
			}
			if inWindow > limit+1e-6 {
				t.Fatalf("seed %d: window ending %v holds %.0f, limit %.0f", seed, at.Sub(t0), inWindow, limit)
			}
		}
	}
	if moves == 0 {
		t.Fatal("no waiting booking was ever moved earlier: the rebook path went untested")
	}
	t.Logf("%d waiting bookings moved earlier", moves)
}

// TestWindowLogRebookMovesOnlyTheWaitingCallEarlier: room freed after a
// call was booked to wait lets it go sooner, never later, and a booking
// that is not the last stays where it is.
func TestWindowLogRebookMovesOnlyTheWaitingCallEarlier(t *testing.T) {
	t0 := time.Unix(0, 0)
	w := NewWindowLog(time.Minute, 1000)
	_, first := w.reserveEntry(t0, t0, 600)
	d, waiting := w.reserveEntry(t0.Add(time.Second), t0.Add(time.Second), 600)
	if d != 59*time.Second {
		t.Fatalf("wait %v, want 59s", d)
	}
	now := t0.Add(2 * time.Second)
	if got := w.rebookEntry(now, now, waiting); got != 58*time.Second {
		t.Fatalf("rebook with nothing freed: wait %v, want 58s", got)
	}
	w.adjustEntry(now, first, 500) // the first answer was short: 100 used
	if got := w.rebookEntry(now, now, waiting); got != 0 {
		t.Fatalf("rebook after room was freed: wait %v, want 0", got)
	}
	if got := w.rebookEntry(now, now.Add(time.Second), first); got != -2*time.Second {
		t.Fatalf("a booking that is not the last moved: at %v from now, want -2s", got)
	}
	if lvl := w.Level(now); lvl != 300 {
		t.Fatalf("level %v, want 300", lvl)
	}
}

// TestWindowLogGuard: with a guard, room a booking leaves goes to a new
// call only the guard after the window has moved past it; what a window
// held is still counted over the window alone.
func TestWindowLogGuard(t *testing.T) {
	t0 := time.Unix(0, 0)
	w := NewWindowLog(time.Minute, 1000)
	w.SetGuard(100 * time.Millisecond)
	w.Reserve(t0, 800)
	if d := w.Reserve(t0.Add(time.Second), 800); d != 59100*time.Millisecond {
		t.Fatalf("wait %v, want 59.1s (a minute and the guard after the first booking)", d)
	}
	now := t0.Add(60050 * time.Millisecond)
	if got := w.SumAt(now, now); got != 0 {
		t.Fatalf("window ending %v holds %v, want 0 (the first booking left it, the second is not sent)", now.Sub(t0), got)
	}
	if lvl := w.Level(now); lvl != -600 {
		t.Fatalf("level in the guard band %v, want -600 (both bookings still count)", lvl)
	}
	if got := w.SumAt(now.Add(time.Second), now.Add(time.Second)); got != 800 {
		t.Fatalf("window ending %v holds %v, want 800", now.Add(time.Second).Sub(t0), got)
	}
}

// TestWindowLogSettlesWhereTheCallWasCounted: corrections move the booking
// they belong to, not the present, as a provider's sliding window does.
func TestWindowLogSettlesWhereTheCallWasCounted(t *testing.T) {
	t0 := time.Unix(0, 0)
	w := NewWindowLog(time.Minute, 1000)
	if d, _ := w.reserveEntry(t0, t0, 300); d != 0 {
		t.Fatalf("first wait %v", d)
	}
	_, id := w.reserveEntry(t0.Add(10*time.Second), t0.Add(10*time.Second), 600)
	// The call booked at 10 s used 400 more: the window is full until that
	// booking leaves it at 70 s, so a call at 30 s waits until then.
	w.adjustEntry(t0.Add(30*time.Second), id, -400)
	if d := w.Reserve(t0.Add(30*time.Second), 100); d != 40*time.Second {
		t.Fatalf("wait after a late settlement %v, want 40s", d)
	}
	// A refund of a booking gives room only in windows that held it.
	w2 := NewWindowLog(time.Minute, 1000)
	_, id = w2.reserveEntry(t0, t0, 900)
	w2.adjustEntry(t0.Add(5*time.Second), id, 800)
	if d := w2.Reserve(t0.Add(5*time.Second), 800); d != 0 {
		t.Fatalf("wait after a refund %v, want 0", d)
	}
	if lvl := w2.Level(t0.Add(5 * time.Second)); lvl != 100 {
		t.Fatalf("level %v, want 100", lvl)
	}
	// Bookings out of every window are gone, and corrections to them too.
	w2.adjustEntry(t0.Add(61*time.Second), id, -5000)
	if lvl := w2.Level(t0.Add(61 * time.Second)); lvl != 200 {
		t.Fatalf("level after the first booking left %v, want 200", lvl)
	}
}

func TestWindowLogClampAndLargeCalls(t *testing.T) {
	t0 := time.Unix(0, 0)
	w := NewWindowLog(time.Minute, 1000)
	w.Clamp(t0, 250)
	if lvl := w.Level(t0); lvl != 250 {
		t.Fatalf("level after clamp %v, want 250", lvl)
	}
	if d := w.Reserve(t0.Add(time.Second), 300); d != 59*time.Second {
		t.Fatalf("wait %v, want 59s (until the clamp leaves the window)", d)
	}
	// A call larger than the limit waits for an empty window, then goes.
	if d := w.Reserve(t0.Add(time.Minute), 5000); d != 60*time.Second {
		t.Fatalf("oversized call waits %v, want 60s", d)
	}
	w.SetRate(t0, 0, 100) // 100/s = 6,000 a minute
	if lvl := w.Level(t0.Add(3 * time.Minute)); lvl != 6000 {
		t.Fatalf("level of an empty log %v, want 6000", lvl)
	}
}

// TestWindowLogClampAt: a provider's remaining count is compared with the
// minute it was taken in, and only a shortfall is booked.
func TestWindowLogClampAt(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	w := NewWindowLog(time.Minute, 1000)
	w.Reserve(at(0), 300)
	w.Reserve(at(10), 200)
	w.Reserve(at(50), 100)
	// The window ending at 65 s holds 300 (10 s and 50 s). The provider,
	// answering at 65 s for the call it admitted at 10 s, had 500 left
	// then: the log agrees (0 s and 10 s: 500 booked), nothing is booked.
	w.ClampAt(at(65), at(10), 500)
	if lvl := w.Level(at(65)); lvl != 700 {
		t.Fatalf("level %v, want 700", lvl)
	}
	// It had only 400 left: the 100 the log did not know of is booked now.
	w.ClampAt(at(65), at(10), 400)
	if lvl := w.Level(at(65)); lvl != 600 {
		t.Fatalf("level after a shortfall %v, want 600", lvl)
	}
	// A figure for a minute the log no longer keeps is ignored.
	w.ClampAt(at(200), at(10), 0)
	if lvl := w.Level(at(200)); lvl != 1000 {
		t.Fatalf("level %v, want 1000", lvl)
	}
	// Settling a booking that has left the window still counts for ClampAt.
	w2 := NewWindowLog(time.Minute, 1000)
	_, id := w2.reserveEntry(at(0), at(0), 300)
	w2.Reserve(at(65), 100)
	w2.adjustEntry(at(66), id, -200) // the call at 0 s used 500
	w2.ClampAt(at(66), at(30), 500)  // the window ending at 30 s held 500: agrees
	if lvl := w2.Level(at(66)); lvl != 900 {
		t.Fatalf("level %v, want 900", lvl)
	}
	w2.ClampAt(at(66), at(30), 450)
	if lvl := w2.Level(at(66)); lvl != 850 {
		t.Fatalf("level %v, want 850", lvl)
	}
}

// TestWindowLogSetLimit: a lower limit scales the bookings (same fill, new
// rate at once); a higher one keeps them (room at once).
func TestWindowLogSetLimit(t *testing.T) {
	t0 := time.Unix(0, 0)
	w := NewWindowLog(time.Minute, 900)
	_, id := w.reserveEntry(t0, t0, 600)
	w.SetLimit(t0, 600)
	if lvl := w.Level(t0); lvl != 200 {
		t.Fatalf("level after a lower limit %v, want 200 (a third free, as before)", lvl)
	}
	w.adjustEntry(t0, id, 100) // settling corrects the scaled booking
	if lvl := w.Level(t0); lvl != 300 {
		t.Fatalf("level after a refund %v, want 300", lvl)
	}
	w.SetLimit(t0, 1200)
	if lvl := w.Level(t0); lvl != 900 {
		t.Fatalf("level after a higher limit %v, want 900", lvl)
	}
}
