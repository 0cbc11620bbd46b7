package flow

import (
	"math"
	"sync"
	"time"
)

// RateCap is auto's send-rate governor: the configured quotas are the
// upper bound, but a 429 the buckets did not foresee (a growth-rate rule
// after idle, a limit lowered by the platform without notice) means the
// provider admits less than configured right now. Cutting concurrency does
// not slow a pacer that sends at the configured rate, so RateCap scales the
// pacer's gaps instead: multiplicative decrease to β × the rate the
// provider admitted in the last second (sent less refused: after a halving
// the rate sent is twice what the limit lets through, and a cut from it
// leaves the rate above the limit for another round of 429s), then a
// CUBIC-shaped recovery (fast far below the rate of the last cut, a plateau
// around it, growth beyond it), never faster than the growth a burst rule
// allows (10% a second: 2× the 10 s average tolerates up to ~12%). The
// rate admitted when a 429 came is the best measure of the provider's limit
// there is, so the recovery holds at 97% of it before it probes past it
// again: every probe past a limit costs a 429, and a per-second window
// answers one as soon as the rate is above it. After a request or token
// 429 the hold spaces probes so that they cost at most rateCapProbeShare of
// the calls at the admitted rate (a limit the platform lowered stays
// lowered for a while); after a growth-rate 429, whose threshold rises with
// the traffic admitted, it is rateCapHold. At scale 1 it is off. Pure: time
// is passed in. See docs/design.md#rate-cap.
type RateCap struct {
	mu      sync.Mutex
	scale   float64   // fraction of the configured rate; 1 = no cap
	wm      float64   // scale admitted when the last cut happened
	k       float64   // seconds after the cut at which the cubic is back at wm
	lastCut time.Time // zero: never cut
	// holdUntil ends the hold after the last cut: until then the recovery
	// stays at rateCapHoldAt × wm instead of probing past it.
	holdUntil time.Time
	last      time.Time         // last growth update
	bins      [rateBins]float64 // configured-rate seconds sent, per bin
	refused   [rateBins]float64 // of those, refused with a 429
	calls     [rateBins]float64 // calls sent, per bin
	refCalls  [rateBins]float64 // of those, refused
	binIdx    int64             // index (time/binWidth) of the newest bin
	cuts      int
}

const (
	rateBins      = 10
	rateBinWidth  = 100 * time.Millisecond
	rateCapBeta   = 0.7              // cut factor far from a known ceiling
	rateCapBetaWM = 0.85             // cut factor when the 429 came at the previous ceiling
	rateCapC      = 0.002            // cubic coefficient, scale per s³
	rateCapGrowth = 0.10             // at most +10% a second
	rateCapMin    = 0.02             // floor of the scale
	rateCapEcho   = time.Second      // a per-second window (RPS, the burst rule's second)
	rateCapHold   = 15 * time.Second // between probes past a growth-rate limit; the least hold
	rateCapHoldAt = 0.97             // of the measured limit while holding: room for send jitter
	rateCapFullAt = 0.9              // admitted ≤ this × sent: the provider's window was full
	// rateCapProbeShare is the share of calls that probes past a measured
	// request or token limit may cost: one 429 each, so at an admitted rate
	// of r calls a second they come at most every 1/(share × r) seconds.
	rateCapProbeShare = 0.002
	rateCapMaxHold    = 5 * time.Minute // a limit lowered for longer is probed at least this often
)

// NewRateCap returns a rate cap that is off (scale 1) at now.
func NewRateCap(now time.Time) *RateCap { return &RateCap{scale: 1, wm: 1, last: now} }

// advance rotates the utilisation bins to now.
func (c *RateCap) advance(now time.Time) {
	idx := now.UnixNano() / int64(rateBinWidth)
	if idx <= c.binIdx {
		return
	}
	if idx-c.binIdx >= rateBins {
		c.bins, c.refused = [rateBins]float64{}, [rateBins]float64{}
		c.calls, c.refCalls = [rateBins]float64{}, [rateBins]float64{}
	} else {
		for i := c.binIdx + 1; i <= idx; i++ {
			c.bins[i%rateBins], c.refused[i%rateBins] = 0, 0
			c.calls[i%rateBins], c.refCalls[i%rateBins] = 0, 0
		}
	}
	c.binIdx = idx
}

// utilisation is the share of the configured rate sent over the last
// second, and the share admitted: what was sent less what the provider
// refused (OnRateLimit). The bins hold 0.9 to 1 s of sends and are read as
// a whole second: the admitted rate errs low by up to a tenth, never high,
// since the hold below a measured limit (OnRateLimit) is taken from it.
func (c *RateCap) utilisation(now time.Time) (sent, admitted float64) {
	c.advance(now)
	var s, r float64
	for i, v := range c.bins {
		s += v
		r += c.refused[i]
	}
	span := (rateBins * rateBinWidth).Seconds()
	return s / span, math.Max(0, s-r) / span
}

// admittedCalls is the calls per second the provider admitted over the
// last second (read as utilisation is).
func (c *RateCap) admittedCalls() float64 {
	var s, r float64
	for i, v := range c.calls {
		s += v
		r += c.refCalls[i]
	}
	return math.Max(0, s-r) / (rateBins * rateBinWidth).Seconds()
}

// probeHold is how long the cap holds below a request or token limit it
// measured at callsPerSecond admitted: probes past it cost at most
// rateCapProbeShare of the calls, and come at least every rateCapMaxHold.
func probeHold(callsPerSecond float64) time.Duration {
	if callsPerSecond <= 0 {
		return rateCapMaxHold
	}
	hold := time.Duration(float64(time.Second) / (rateCapProbeShare * callsPerSecond))
	return min(max(hold, rateCapHold), rateCapMaxHold)
}

// grow moves the scale along the recovery curve up to now.
func (c *RateCap) grow(now time.Time) {
	dt := now.Sub(c.last).Seconds()
	if dt <= 0 {
		return
	}
	c.last = now
	if c.scale >= 1 {
		return
	}
	t := now.Sub(c.lastCut).Seconds()
	cubic := c.wm + rateCapC*math.Pow(t-c.k, 3)
	next := math.Min(math.Max(cubic, c.scale), c.scale*math.Exp(rateCapGrowth*dt))
	if now.Before(c.holdUntil) {
		next = math.Min(next, math.Max(c.scale, rateCapHoldAt*c.wm))
	}
	c.scale = math.Min(1, next)
}

// Spacing returns the gap to book after a send whose gap at the configured
// rate is full.
func (c *RateCap) Spacing(now time.Time, full time.Duration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grow(now)
	if c.scale >= 1 {
		return full
	}
	return time.Duration(float64(full) / c.scale)
}

// Sent records a send at now that used full of the configured rate's time.
// OnRateLimit takes it back if the provider refuses it.
func (c *RateCap) Sent(now time.Time, full time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(now)
	c.bins[c.binIdx%rateBins] += full.Seconds()
	c.calls[c.binIdx%rateBins]++
}

// OnRateLimit takes back the send of a call sent at sentAt that the
// provider refused with a 429 (full as given to Sent) and cuts the rate;
// growth says the 429 came from a growth-rate rule (its threshold rises
// with the traffic admitted, so the hold is the short one). A call
// sent before the last cut was sent at the old rate, and one sent within
// rateCapEcho after it met a provider window that still held sends at the
// old rate: neither cuts again (one cut per window, as TCP cuts once per
// round trip); cutting on those echoes would cut several times for one
// overrun.
func (c *RateCap) OnRateLimit(now, sentAt time.Time, full time.Duration, growth bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(now)
	if idx := sentAt.UnixNano() / int64(rateBinWidth); idx > c.binIdx-rateBins && idx <= c.binIdx {
		c.refused[idx%rateBins] += full.Seconds()
		c.refCalls[idx%rateBins]++
	}
	if !c.lastCut.IsZero() && sentAt.Before(c.lastCut.Add(rateCapEcho)) {
		return
	}
	c.grow(now)
	sent, admitted := c.utilisation(now)
	cur := math.Min(c.scale, math.Max(admitted, rateCapMin))
	beta := rateCapBeta
	// The cut came at the ceiling of the one before, or the provider
	// refused part of the last second's sends: what it admitted is what
	// its window holds, and a gentler cut drains it.
	if (c.cuts > 0 && math.Abs(cur-c.wm) <= 0.15*c.wm) || admitted <= rateCapFullAt*sent {
		beta = rateCapBetaWM
	}
	hold := rateCapHold
	if !growth {
		hold = probeHold(c.admittedCalls())
	}
	c.holdUntil = now.Add(hold)
	c.wm = cur
	c.scale = math.Max(rateCapMin, cur*beta)
	c.k = math.Cbrt((c.wm - c.scale) / rateCapC)
	c.lastCut, c.last = now, now
	c.cuts++
}

// Scale reports the current scale (1 = uncapped).
func (c *RateCap) Scale(now time.Time) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grow(now)
	return c.scale
}

// Adopt starts the cap at scale, a fraction of the configured rate that
// another sender of the same quota is held to now, if that is below this
// cap's own: the provider admits less than configured for all of them (a
// halved limit), and a newcomer sending at the configured rate would only
// find out by a 429. Recovery then follows the cubic from scale, as after
// a cut at that rate. Scales outside (rateCapMin, 1) are ignored.
func (c *RateCap) Adopt(now time.Time, scale float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grow(now)
	if math.IsNaN(scale) || scale >= c.scale || scale >= 1 {
		return
	}
	c.scale = math.Max(scale, rateCapMin)
	c.wm, c.k = c.scale, 0
	c.lastCut, c.last = now, now
	c.cuts = max(c.cuts, 1)
}
