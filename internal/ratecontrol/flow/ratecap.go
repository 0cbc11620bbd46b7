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
// pacer's gaps instead: multiplicative decrease to β × the rate actually
// sent in the last second, then a CUBIC-shaped recovery (fast far below the
// rate of the last cut, a plateau around it, growth beyond it), never
// faster than the growth a burst rule allows (10% a second: 2× the 10 s
// average tolerates up to ~12%). At scale 1 it is off. Pure: time is passed
// in. See docs/design.md#rate-cap.
type RateCap struct {
	mu      sync.Mutex
	scale   float64   // fraction of the configured rate; 1 = no cap
	wm      float64   // scale sent when the last cut happened
	k       float64   // seconds after the cut at which the cubic is back at wm
	lastCut time.Time // zero: never cut
	last    time.Time // last growth update
	bins    [rateBins]float64
	binIdx  int64 // index (time/binWidth) of the newest bin
	cuts    int
}

const (
	rateBins      = 10
	rateBinWidth  = 100 * time.Millisecond
	rateCapBeta   = 0.7         // cut factor far from a known ceiling
	rateCapBetaWM = 0.85        // cut factor when the 429 came at the previous ceiling
	rateCapC      = 0.002       // cubic coefficient, scale per s³
	rateCapGrowth = 0.10        // at most +10% a second
	rateCapMin    = 0.02        // floor of the scale
	rateCapEcho   = time.Second // a per-second window (RPS, the burst rule's second)
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
		c.bins = [rateBins]float64{}
	} else {
		for i := c.binIdx + 1; i <= idx; i++ {
			c.bins[i%rateBins] = 0
		}
	}
	c.binIdx = idx
}

// utilisation is the share of the configured rate sent over the last second.
func (c *RateCap) utilisation(now time.Time) float64 {
	c.advance(now)
	var s float64
	for _, v := range c.bins {
		s += v
	}
	return s / (rateBins * rateBinWidth).Seconds()
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
func (c *RateCap) Sent(now time.Time, full time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(now)
	c.bins[c.binIdx%rateBins] += full.Seconds()
}

// OnRateLimit cuts the rate after a 429 of a call sent at sentAt. A call
// sent before the last cut was sent at the old rate, and one sent within
// rateCapEcho after it met a provider window that still held sends at the
// old rate: neither cuts again (one cut per window, as TCP cuts once per
// round trip); cutting on those echoes would cut several times for one
// overrun.
func (c *RateCap) OnRateLimit(now, sentAt time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lastCut.IsZero() && sentAt.Before(c.lastCut.Add(rateCapEcho)) {
		return
	}
	c.grow(now)
	cur := math.Min(c.scale, math.Max(c.utilisation(now), rateCapMin))
	beta := rateCapBeta
	if c.cuts > 0 && math.Abs(cur-c.wm) <= 0.15*c.wm {
		beta = rateCapBetaWM // the same ceiling again: a gentler cut
	}
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
