package flow

import (
	"math"
	"sync"
	"time"
)

// WarmupBucket is the guide's token bucket with continuous warm-up
// (docs/design.md#warm-up): it starts empty and its issuance rate rises
// linearly from 0 to the target rate R over the warm-up period T, so the
// tokens issued by time t after the start are
//
//	F(t) = R·t²/(2T)           for t ≤ T
//	F(t) = R·T/2 + R·(t − T)   for t > T
//
// A reservation in debt waits until F reaches the booked amount (the
// inverse of F), which keeps FIFO order as in Bucket.
//
// Added to the guide's: slow-start restart. With SetIdleRestart(d), a
// reservation that comes after more than d without any restarts the warm-up
// from an empty bucket, so traffic after an idle period ramps up again
// instead of spending a full bucket at once (the growth-rate rule). With
// SetRampedCapacity, the capacity ramps up with the rate.
type WarmupBucket struct {
	mu         sync.Mutex
	capacity   float64
	rate       float64 // R, tokens per second once warm
	warmup     float64 // T, seconds
	start      time.Time
	tokens     float64
	cumulative float64 // F at the last update
	lastUpdate time.Time
	lastUse    time.Time
	idle       time.Duration
	restarts   int
	used       bool    // a reservation came: Warmth reports traffic, not only time
	floor      float64 // > 0: the capacity ramps up with the rate (SetRampedCapacity)
}

var _ Limiter = (*WarmupBucket)(nil)

// NewWarmupBucket returns an empty bucket whose warm-up starts at now.
// The guide's TokenBucket(quota_per_minute=Q, warmup_seconds=T) is
// NewWarmupBucket(Q, Q/60, T, now).
func NewWarmupBucket(capacity, perSecond float64, warmup time.Duration, now time.Time) *WarmupBucket {
	return &WarmupBucket{capacity: capacity, rate: perSecond, warmup: math.Max(0, warmup.Seconds()),
		start: now, lastUpdate: now, lastUse: now}
}

// SetIdleRestart enables slow-start restart after d without reservations
// (0 disables it).
func (w *WarmupBucket) SetIdleRestart(d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.idle = d
}

// SetRampedCapacity makes the capacity grow with the warm-up as the rate
// does, from floor at the start to the full capacity once warm: a bucket
// that banks a few milliseconds of its rate banks a few milliseconds of
// the ramp's rate while it ramps, not of the target's, so the ramp stays a
// ramp. 0 keeps the guide's fixed capacity.
func (w *WarmupBucket) SetRampedCapacity(floor float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.floor = floor
}

// capacityAt is the capacity at elapsed seconds into the warm-up.
func (w *WarmupBucket) capacityAt(elapsed float64) float64 {
	if w.floor <= 0 || w.warmup <= 0 || elapsed >= w.warmup {
		return w.capacity
	}
	return math.Min(w.capacity, math.Max(w.floor, w.capacity*elapsed/w.warmup))
}

// Restarts reports how many slow-start restarts happened.
func (w *WarmupBucket) Restarts() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.restarts
}

// cumulativeAt is the guide's _get_cumulative_tokens.
func cumulativeAt(R, T, t float64) float64 {
	if t <= 0 {
		return 0
	}
	if T <= 0 {
		return R * t
	}
	if t <= T {
		return (R / (2 * T)) * (t * t)
	}
	return (R*T)/2.0 + R*(t-T)
}

// timeForCumulative is the guide's _get_time_for_cumulative_tokens.
func timeForCumulative(R, T, target float64) float64 {
	if target <= 0 {
		return 0
	}
	if T <= 0 {
		return target / R
	}
	warm := (R * T) / 2.0
	if target <= warm {
		return math.Sqrt((2 * T * target) / R)
	}
	return (target-warm)/R + T
}

func (w *WarmupBucket) update(now time.Time) {
	if now.Before(w.lastUpdate) {
		now = w.lastUpdate
	}
	elapsed := now.Sub(w.start).Seconds()
	cum := cumulativeAt(w.rate, w.warmup, elapsed)
	w.tokens = math.Min(w.capacityAt(elapsed), w.tokens+cum-w.cumulative)
	w.cumulative = cum
	w.lastUpdate = now
}

// Reserve is the guide's reserve(cost) with now passed in.
func (w *WarmupBucket) Reserve(now time.Time, n float64) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return seconds(w.reserve(now, n))
}

func (w *WarmupBucket) reserve(now time.Time, n float64) float64 {
	if w.idle > 0 && now.Sub(w.lastUse) > w.idle && now.Sub(w.lastUpdate) >= 0 {
		w.update(now)
		if w.tokens >= 0 { // debt still owed is kept; only savings go
			w.start, w.cumulative, w.tokens, w.lastUpdate = now, 0, 0, now
			w.restarts++
		}
	}
	if now.After(w.lastUse) {
		w.lastUse = now
	}
	w.used = true
	w.update(now)
	if w.tokens >= n {
		w.tokens -= n
		return 0
	}
	deficit := n - w.tokens
	w.tokens -= n
	rel := w.lastUpdate.Sub(w.start).Seconds()
	wait := timeForCumulative(w.rate, w.warmup, w.cumulative+deficit) - rel
	return math.Max(0, wait)
}

// Adjust is the guide's adjust(amount), after an update (see Bucket.Adjust).
func (w *WarmupBucket) Adjust(now time.Time, delta float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.update(now)
	w.tokens = math.Min(w.capacityAt(w.lastUpdate.Sub(w.start).Seconds()), w.tokens+delta)
}

// Clamp lowers the level to at most max.
func (w *WarmupBucket) Clamp(now time.Time, max float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.update(now)
	w.tokens = math.Min(w.tokens, max)
}

// Level reports the tokens available at now.
func (w *WarmupBucket) Level(now time.Time) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.update(now)
	return w.tokens
}

// SetRate changes capacity and target rate from now on. Progress through
// the warm-up (t/T) is kept and F is re-based so the level does not jump.
func (w *WarmupBucket) SetRate(now time.Time, capacity, perSecond float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.update(now)
	w.capacity, w.rate = capacity, perSecond
	w.tokens = math.Min(w.tokens, w.capacityAt(w.lastUpdate.Sub(w.start).Seconds()))
	w.cumulative = cumulativeAt(w.rate, w.warmup, w.lastUpdate.Sub(w.start).Seconds())
}

// Warmth reports how far the warm-up of a bucket in use has come at now,
// as the fraction of the target rate it issues at: t/T during the
// warm-up, 1 after it. It is 0 before the first reservation (the ramp runs
// on time, and a bucket nobody used says nothing of the traffic) and once
// the bucket has been idle longer than the slow-start restart (its next
// reservation starts over).
func (w *WarmupBucket) Warmth(now time.Time) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.used || (w.idle > 0 && now.Sub(w.lastUse) > w.idle) {
		return 0
	}
	if w.warmup <= 0 {
		return 1
	}
	return math.Min(1, math.Max(0, now.Sub(w.start).Seconds()/w.warmup))
}

// WarmTo moves the warm-up forward to warmth f (a fraction of the target
// rate, as Warmth reports it) if it is behind it: the issuance rate jumps
// to f·R and the ramp goes on from there. Nothing is banked for the part
// of the ramp it skips, so the bucket does not send a burst either: it
// starts at a rate, not with a stock. A warm start for a replica that
// joins traffic the provider already sees (internal/quota).
func (w *WarmupBucket) WarmTo(now time.Time, f float64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.warmup <= 0 || !(f > 0) {
		return false
	}
	f = math.Min(f, 1)
	w.update(now)
	if w.lastUpdate.Sub(w.start).Seconds() >= f*w.warmup {
		return false
	}
	w.start = w.lastUpdate.Add(-time.Duration(f * w.warmup * float64(time.Second)))
	w.cumulative = cumulativeAt(w.rate, w.warmup, w.lastUpdate.Sub(w.start).Seconds())
	if now.After(w.lastUse) {
		w.lastUse = now // the warm start counts as use: no restart right after it
	}
	return true
}
