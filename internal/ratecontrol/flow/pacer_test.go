package flow

import (
	"slices"
	"testing"
	"time"
)

// TestPacerTokenScheduleMakesUpButIntervalNever: after a stall the token
// gaps are made up (up to the slack), the interval never is; Shift moves
// the token schedule; Cancel gives back the last reservation.
func TestPacerTokenScheduleMakesUpButIntervalNever(t *testing.T) {
	t0 := time.Unix(0, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	p := NewPacer(ms(100))
	p.SetSlack(time.Second)
	if w := p.ReserveSpacing(t0, ms(500)); w != 0 {
		t.Fatalf("first wait %v", w)
	}
	// Stalled until 2 s: the token schedule is 1.5 s behind, so the next
	// sends follow at the interval until it has caught up with the slack.
	now := t0.Add(2 * time.Second)
	var waits []time.Duration
	for range 4 {
		w := p.ReserveSpacing(now, ms(500))
		waits = append(waits, w)
	}
	want := []time.Duration{0, ms(100), ms(200), ms(500)} // tokens at 1.0, 1.5, 2.0, 2.5 s; interval from 2.0
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits after a stall %v, want %v", waits, want)
		}
	}
	// A strict gap is never made up.
	q := NewPacer(ms(100))
	q.SetSlack(time.Second)
	q.ReserveGaps(t0, ms(400), 0)
	if w := q.ReserveGaps(t0.Add(ms(50)), 0, 0); w != ms(350) {
		t.Fatalf("wait after a strict gap %v, want 350ms", w)
	}
	// Shift delays the token schedule; Cancel restores the last booking.
	r := NewPacer(0)
	r.ReserveSpacing(t0, ms(100))
	r.Shift(t0, ms(300))
	w := r.ReserveSpacing(t0, ms(100))
	if w != ms(400) {
		t.Fatalf("wait after a shift %v, want 400ms", w)
	}
	r.Cancel()
	if w := r.ReserveSpacing(t0, 0); w != ms(400) {
		t.Fatalf("wait after cancel %v, want 400ms", w)
	}
}

// TestPacerIntervalFollowsALateSend: a send that went out later than its
// slot pushes the next slot to a full interval after it; one on time, or
// early, changes nothing.
func TestPacerIntervalFollowsALateSend(t *testing.T) {
	t0 := time.Unix(100, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	p := NewPacer(ms(50))
	p.Reserve(t0) // slot at 0
	if w := p.Reserve(t0); w != ms(50) {
		t.Fatalf("second slot in %v, want 50ms", w)
	}
	p.SentAt(t0.Add(ms(80))) // the second send goes out 30 ms after its slot
	if w := p.Reserve(t0.Add(ms(80))); w != ms(50) {
		t.Fatalf("slot after a send 30 ms late in %v, want a full 50ms after it", w)
	}
	p.SentAt(t0.Add(ms(130))) // on time
	if w := p.Reserve(t0.Add(ms(130))); w != ms(50) {
		t.Fatalf("slot after an on-time send in %v, want 50ms", w)
	}
	p.SentAt(t0.Add(ms(100))) // earlier than booked: ignored
	if w := p.Reserve(t0.Add(ms(180))); w != ms(50) {
		t.Fatalf("slot after a report of an early send in %v, want 50ms", w)
	}
}

// TestPacerLatenessKeepsTheSchedule: a reservation that comes up to the
// lateness after the next slot takes that slot, so the sends behind a late
// caller catch up with the schedule (each still an interval after the one
// before on it); one that comes later than that, after a pause, starts from
// now, with no burst, and so does one after a strict gap; without a
// lateness the schedule starts from now after every late reservation.
func TestPacerLatenessKeepsTheSchedule(t *testing.T) {
	t0 := time.Unix(100, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	reserve := func(p *Pacer, now time.Time, n int) []time.Duration {
		var waits []time.Duration
		for range n {
			waits = append(waits, p.Reserve(now))
		}
		return waits
	}
	p := NewPacer(ms(1))
	p.SetSlack(time.Second) // as auto's; with none the token schedule starts from now
	p.SetLateness(ms(5))
	p.Reserve(t0) // slot at 0; the next at 1 ms
	// The caller comes 2 ms after the next slot: slots 1, 2 and 3 ms go
	// at once, then 4 and 5 ms are 1 and 2 ms away.
	if got, want := reserve(p, t0.Add(ms(3)), 5), []time.Duration{0, 0, 0, ms(1), ms(2)}; !slices.Equal(got, want) {
		t.Fatalf("waits 2 ms after the next slot %v, want %v", got, want)
	}
	// A pause: 95 ms after the next slot (6 ms) the schedule starts from now.
	if got, want := reserve(p, t0.Add(ms(101)), 3), []time.Duration{0, ms(1), ms(2)}; !slices.Equal(got, want) {
		t.Fatalf("waits after a pause %v, want %v (no burst)", got, want)
	}

	// A strict gap (auto's rate cap after a 429) is not made up: not the
	// one before a late booking, nor the one a late booking makes, nor the
	// one a cancelled booking came after.
	lateP := func() *Pacer {
		r := NewPacer(ms(1))
		r.SetSlack(time.Second)
		r.SetLateness(ms(5))
		return r
	}
	r := lateP()
	r.ReserveGaps(t0, ms(2), 0) // the next slot at 2 ms
	if got, want := reserve(r, t0.Add(ms(4)), 2), []time.Duration{0, ms(1)}; !slices.Equal(got, want) {
		t.Fatalf("waits 2 ms after a strict gap's slot %v, want %v", got, want)
	}
	r = lateP()
	r.Reserve(t0) // the next slot at 1 ms
	late := t0.Add(ms(4))
	if got, want := []time.Duration{r.ReserveGaps(late, ms(2), 0), r.Reserve(late)}, []time.Duration{0, ms(2)}; !slices.Equal(got, want) {
		t.Fatalf("waits of a late booking with a strict gap and the next %v, want %v", got, want)
	}
	r = lateP()
	r.Reserve(t0)
	r.ReserveGaps(t0.Add(ms(1)), ms(2), 0) // at 1 ms, the next slot at 3 ms
	r.Reserve(t0.Add(ms(1)))               // at 3 ms ...
	r.Cancel()                             // ... given back
	if got, want := reserve(r, t0.Add(ms(6)), 2), []time.Duration{0, ms(1)}; !slices.Equal(got, want) {
		t.Fatalf("waits 3 ms after a strict gap's slot, a booking cancelled between, %v, want %v", got, want)
	}

	q := NewPacer(ms(1))
	q.SetSlack(time.Second)
	q.Reserve(t0)
	if got, want := reserve(q, t0.Add(ms(3)), 3), []time.Duration{0, ms(1), ms(2)}; !slices.Equal(got, want) {
		t.Fatalf("waits without a lateness %v, want %v", got, want)
	}
}
