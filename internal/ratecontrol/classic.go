package ratecontrol

import (
	"context"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/ratecontrol/flow"
)

// acquireClassic is the admission of retry, ratelimit, shaping and
// adaptive: book the cost on every limiter and wait for the longest wait,
// then take a concurrency slot and wait for the pacer inside it
// (docs/design.md#admission-order).
func (g *Governor) acquireClassic(ctx context.Context, pl *pipeline, p *Permit, req Request, now time.Time) (*Permit, error) {
	now, err := g.admit(ctx, pl, p, req, now)
	if err != nil {
		return nil, err
	}
	if err := g.slotAndPace(ctx, pl, p, now); err != nil {
		if pl.adm != nil {
			pl.adm.Refund(g.now(), p.res)
		}
		return nil, err
	}
	g.grant(p)
	return p, nil
}

// admit books the call's cost on every limiter and waits until they all
// let it go; it returns the time after the wait. Sequence numbers and
// reservations are taken in one order: under the gate (adaptive), which
// lets one caller at a time reserve and wait, or under seqMu. If the wait
// is cut short, everything booked is refunded.
func (g *Governor) admit(ctx context.Context, pl *pipeline, p *Permit, req Request, now time.Time) (time.Time, error) {
	if pl.adm == nil {
		p.seq = g.seq.Add(1)
		return now, nil
	}
	if pl.gate != nil {
		waited, err := pl.gate.AcquireFunc(ctx, nil)
		if err != nil {
			return now, fmt.Errorf("ratecontrol: wait for admission turn: %w", err)
		}
		if waited {
			now = g.now()
		}
	} else {
		g.seqMu.Lock()
	}
	p.seq = g.seq.Add(1)
	cost := g.cost(req)
	p.booked = cost.Get(DimTokens)
	p.res = pl.adm.Reserve(now, cost)
	if pl.gate == nil {
		g.seqMu.Unlock()
	}
	err := sleepCtx(ctx, p.res.Wait)
	if pl.gate != nil {
		pl.gate.Release()
	}
	if err != nil {
		pl.adm.Refund(g.now(), p.res)
		return now, fmt.Errorf("ratecontrol: wait for admission: %w", err)
	}
	if p.res.Wait > 0 {
		now = g.now()
	}
	return now, nil
}

// slotAndPace takes a concurrency slot, then waits for the pacer inside
// it, as the guide's traffic shaping does, and sets the permit's send time.
// The pacer is booked at the moment the slot is granted, under the
// limiter's lock, so sends keep the admission order. If a wait is cut
// short it holds nothing and gives the pacer's booking back.
func (g *Governor) slotAndPace(ctx context.Context, pl *pipeline, p *Permit, now time.Time) error {
	pc := pacing{pl: pl, now: g.now, at: now}
	if pl.sem != nil {
		if _, err := pl.sem.AcquireFunc(ctx, pc.book); err != nil {
			pc.cancel()
			return fmt.Errorf("ratecontrol: wait for concurrency slot: %w", err)
		}
		p.slot = true
	} else {
		pc.book(false)
	}
	if err := sleepCtx(ctx, pc.wait); err != nil {
		pc.cancel()
		if p.slot {
			pl.sem.Release()
		}
		return fmt.Errorf("ratecontrol: wait for pacer: %w", err)
	}
	p.sentAt = pc.at.Add(pc.wait)
	return nil
}

// pacing is one classic admission's booking of the pacer.
type pacing struct {
	pl     *pipeline
	now    func() time.Time
	at     time.Time     // when the slot was granted
	wait   time.Duration // from at to the send
	booked bool
}

// book reserves the pacer's next send; waited says whether the caller
// queued for its slot (then the time is read again).
func (pc *pacing) book(waited bool) {
	if pc.pl.pacer == nil {
		return
	}
	if waited {
		pc.at = pc.now()
	}
	pc.wait = pc.pl.pacer.Reserve(pc.at)
	pc.booked = true
}

// cancel gives the pacer's booking back, if one was made.
func (pc *pacing) cancel() {
	if pc.booked {
		pc.pl.pacer.Cancel()
	}
}

// cost is the pre-deduction of one call per strategy (auto's is made in
// acquireAuto).
func (g *Governor) cost(req Request) flow.Cost {
	switch g.strategy {
	case StrategyRateLimit:
		return flow.Cost{{Dim: DimRequests, N: 1}}
	case StrategyShaping: // the guide's: input tokens only, as estimated
		return flow.Cost{{Dim: DimRequests, N: 1}, {Dim: DimTokens, N: float64(req.InputTokens)}}
	}
	// adaptive: calibrated input + expected output (auto books the same
	// from flow.Calibrator.Booking, under one lock, in acquireAuto).
	return flow.Cost{{Dim: DimRequests, N: 1}, {Dim: DimTokens, N: g.cal.Input(req.InputTokens) + g.cal.Output(req.MaxTokens)}}
}
