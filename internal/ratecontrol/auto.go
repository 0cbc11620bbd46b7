package ratecontrol

import (
	"context"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/ratecontrol/flow"
)

// acquireAuto is auto's admission. One caller at a time (the gate) takes a
// concurrency slot, books its pacer gap, and books its tokens at the send
// time the pacer gives, then waits for the later of the two; the next
// caller starts when this one is sent; a drain after a 429 that begins
// while it waits sends it back to book again after the drain. So every
// booking is made at the moment its call goes out, which is where the
// provider counts it: a booking made before a wait for a slot or for the
// pacer would count the call in a minute that does not hold it. The price:
// the one caller at the head holds its slot while it waits for tokens.
func (g *Governor) acquireAuto(ctx context.Context, pl *pipeline, p *Permit, req Request, now time.Time) (*Permit, error) {
	waited, err := pl.gate.AcquireFunc(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("ratecontrol: wait for admission turn: %w", err)
	}
	defer pl.gate.Release()
	for {
		if waited {
			now = g.now()
		}
		// A 429 that came while this caller queued for its turn drains
		// its send too: the provider refuses until the drain is over.
		now, err = g.awaitDrain(ctx, pl, now)
		if err != nil {
			return nil, err
		}
		sent, w, err := g.bookAuto(ctx, pl, p, req, now)
		if err != nil {
			return nil, err
		}
		if sent {
			return p, nil
		}
		waited = w
	}
}

// bookAuto is one attempt of the head caller: slot, pacer gap and tokens
// booked at the send time, then the wait for it. A 429 that came during
// the wait drains the controller; the send then goes back (sent false) and
// the caller books again after the drain.
func (g *Governor) bookAuto(ctx context.Context, pl *pipeline, p *Permit, req Request, now time.Time) (sent, waited bool, err error) {
	if pl.sem != nil {
		w, err := pl.sem.AcquireFunc(ctx, nil)
		if err != nil {
			return false, false, fmt.Errorf("ratecontrol: wait for concurrency slot: %w", err)
		}
		p.slot = true
		if w {
			now = g.now()
		}
	}
	p.seq = g.seq.Add(1)
	cost, rate := g.price(pl, p, req, now)
	if pl.freed != nil {
		// from here on settlements wake this caller: one that lands
		// between its booking and its wait counts too (a wake-up left
		// over from an earlier caller costs one needless look)
		pl.waiting.Store(true)
	}
	pw, full := pl.pace(now, p.booked, rate)
	wait := pw
	if pl.adm != nil {
		p.res = pl.adm.ReserveAt(now, now.Add(pw), cost)
		wait = p.res.Wait
	}
	wait, err = g.waitToSend(ctx, pl, p, now, wait)
	if err != nil {
		g.unbook(pl, p)
		return false, false, fmt.Errorf("ratecontrol: wait for admission: %w", err)
	}
	if pl.ctl != nil && wait > 0 && pl.ctl.DrainLeft(now.Add(wait)) > 0 {
		g.unbook(pl, p)
		p.slot = false
		return false, true, nil
	}
	p.sentAt, p.paced = now.Add(wait), full
	if pl.pacer != nil && wait > pw && rpsBinds(pl.limits()) {
		// the interval that holds a per-second limit counts from the send
		pl.pacer.SentAt(p.sentAt)
	}
	if pl.rcap != nil {
		pl.rcap.Sent(p.sentAt, full)
	}
	g.grant(p)
	if pl.adm != nil {
		pl.track(p)
	}
	return true, false, nil
}

// price is auto's pre-deduction: calibrated input plus expected output,
// booked under one lock of the calibration (flow.Calibrator.Booking). It ages
// the calls in flight, resizes the token log's reserve for what their
// output may still add, and returns the cost to book and the token rate
// the pacer spaces sends at (0 = none).
func (g *Governor) price(pl *pipeline, p *Permit, req Request, now time.Time) (flow.Cost, float64) {
	if pl.adm == nil {
		return nil, 0
	}
	in, out, dev, scale := g.cal.Booking(req.InputTokens, req.MaxTokens)
	p.booked = in + out
	cost := flow.Cost{{Dim: DimRequests, N: 1}, {Dim: DimTokens, N: p.booked}}
	p.outBooked, p.maxOut = out, float64(req.MaxTokens)
	inflight := g.ageInFlight(pl, now)
	total, own, ok := pl.inflightUncharged(out, p.maxOut)
	p.uncharged = own
	rate := pl.noteCost(now, p.booked, reserveInput{sigmas: g.reserve, scale: scale,
		uncharged: total, ok: ok, inflight: inflight, outDev: dev})
	return cost, rate
}

// pace books auto's pacer for a call of booked tokens: the interval, and a
// gap its tokens fill at the token rate, so sends spread out evenly; aging
// and settlement shift the pacer as they shift the token log
// (pipeline.repace), so the gaps follow the tokens calls use, not what they
// booked. The gaps are at the token rate, not faster: a faster pacer only
// fills the log early and repeats the warm-up's slow first seconds as a dip
// a minute later. After unforeseen 429s the rate cap's gaps are strict: no
// making up for lost time until the cap has lifted. It returns the wait for
// the send slot and the gap at the configured rate.
func (pl *pipeline) pace(now time.Time, booked, rate float64) (wait, full time.Duration) {
	if pl.pacer == nil {
		return 0, 0
	}
	var spacing time.Duration
	if rate > 0 {
		spacing = time.Duration(booked / rate * float64(time.Second))
	}
	full = max(pl.pacer.Interval(), spacing)
	var strict time.Duration
	if cut := pl.rcap.Spacing(now, full); cut > full {
		strict, spacing = cut, 0
	}
	return pl.pacer.ReserveGaps(now, strict, spacing), full
}

// waitToSend waits out the head caller's wait: while settlements may free
// room (a token log), awaitRoom moves the send earlier as they do. It
// returns the wait from now.
func (g *Governor) waitToSend(ctx context.Context, pl *pipeline, p *Permit, now time.Time, wait time.Duration) (time.Duration, error) {
	if wait > 0 && wait < timerFloor {
		// A timer cannot sleep this little: it would wake a millisecond
		// later and hold every caller behind this one for it (auto's
		// gate), capping sends near 2,000 a second whatever the limits.
		// The send goes now, booked at its slot, so the schedule is kept.
		if pl.freed != nil {
			pl.waiting.Store(false)
		}
		return wait, nil
	}
	if pl.freed != nil && wait > 0 {
		return g.awaitRoom(ctx, pl, p, now, wait)
	}
	if pl.freed != nil {
		pl.waiting.Store(false)
	}
	return wait, sleepCtx(ctx, wait)
}

// awaitRoom is the wait of auto's head caller, for its pacer gap and for
// room in the token log. Both were booked from what the calls in flight
// were charged, and answers shorter than booked free room and pull the
// pacer's token schedule earlier before the wait is over: each settlement
// wakes the caller to age the calls in flight and move its send as early as
// it now fits. Without this the log and the pacer stay below their rate for
// the rest of every such wait. It returns the wait from now.
func (g *Governor) awaitRoom(ctx context.Context, pl *pipeline, p *Permit, now time.Time, wait time.Duration) (time.Duration, error) {
	defer pl.waiting.Store(false) // set by acquireAuto before it booked
	deadline := now.Add(wait)
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return wait, ctx.Err()
		case <-t.C:
			return deadline.Sub(now), nil
		case <-pl.freed:
			at := g.now()
			g.ageInFlight(pl, at)
			next := at
			if pl.pacer != nil {
				next = pl.pacer.Recheck(at)
			}
			next = at.Add(pl.adm.Recheck(at, next, p.res))
			if next.Before(deadline) {
				deadline = next
				t.Reset(max(next.Sub(at), 0))
			}
		}
	}
}

// unbook undoes an auto admission whose wait was cut short: the pacer's
// booking, the reservation and the concurrency slot go back.
func (g *Governor) unbook(pl *pipeline, p *Permit) {
	if pl.pacer != nil {
		pl.pacer.Cancel()
	}
	if pl.adm != nil {
		pl.adm.Refund(g.now(), p.res)
	}
	if p.slot {
		pl.sem.Release()
	}
}

// ageInFlight re-prices auto's calls in flight (pipeline.age), counts what
// that charged as booked, and returns the tokens booked by calls in flight.
func (g *Governor) ageInFlight(pl *pipeline, now time.Time) float64 {
	aged := pl.age(now, g.cal)
	g.tokMu.Lock()
	defer g.tokMu.Unlock()
	g.inflightTokens += aged
	return g.inflightTokens
}
