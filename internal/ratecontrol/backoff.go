package ratecontrol

import (
	"math"
	"math/rand/v2"
	"time"
)

// Backoff is exponential backoff with full jitter
// (docs/design.md#backoff): attempt n waits a uniform random time in [0, min(Max,
// Base·2^(n−1))], so retries of many callers spread out instead of coming
// back in unison. A server's Retry-After is a floor: the delay is then
// Retry-After plus a jitter of up to Base, even beyond Max.
type Backoff struct {
	Base, Max time.Duration  // defaults 1s and 60s
	Rand      func() float64 // uniform in [0,1); default math/rand/v2
}

// Delay returns the wait before retry number attempt (1 = first retry).
func (b Backoff) Delay(attempt int, retryAfter time.Duration) time.Duration {
	base, maxD := b.Base, b.Max
	if base <= 0 {
		base = time.Second
	}
	if maxD <= 0 {
		maxD = time.Minute
	}
	rnd := b.Rand
	if rnd == nil {
		rnd = rand.Float64
	}
	if attempt < 1 {
		attempt = 1
	}
	if retryAfter > 0 {
		return retryAfter + time.Duration(rnd()*float64(base))
	}
	ceil := float64(base) * math.Pow(2, float64(attempt-1))
	ceil = math.Min(ceil, float64(maxD))
	return time.Duration(rnd() * ceil)
}
