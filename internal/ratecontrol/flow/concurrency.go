package flow

import (
	"context"
	"sync"
)

// ConcurrencyLimiter is the concurrency semaphore, with a limit that may
// change at any time (static, or driven by the Controller;
// docs/design.md#concurrency). Waiters are served strictly FIFO, so a large
// request is never overtaken (the guide's adaptive example starves large
// requests by waking waiters out of order). A waiter whose context ends
// leaves the queue without taking a slot.
type ConcurrencyLimiter struct {
	mu       sync.Mutex
	limit    int
	inflight int
	waiters  []*slotWaiter
}

type slotWaiter struct {
	ready   chan struct{}
	granted bool
	onGrant func(waited bool)
}

// NewConcurrencyLimiter returns a limiter with the given limit (≤ 0 means
// unlimited).
func NewConcurrencyLimiter(limit int) *ConcurrencyLimiter {
	return &ConcurrencyLimiter{limit: limit}
}

// Acquire takes a slot, waiting in FIFO order; it returns ctx.Err() if ctx
// ends first, holding nothing.
func (c *ConcurrencyLimiter) Acquire(ctx context.Context) error {
	_, err := c.AcquireFunc(ctx, nil)
	return err
}

// AcquireFunc is Acquire that runs onGrant (if not nil) under the limiter's
// lock at the moment the slot is granted, so what it books is booked in
// grant order (the Governor reserves the pacer there); waited tells onGrant
// whether the caller had to queue. It reports whether the caller queued.
// If it returns an error, onGrant may still have run; the slot is not held.
func (c *ConcurrencyLimiter) AcquireFunc(ctx context.Context, onGrant func(waited bool)) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	c.mu.Lock()
	if len(c.waiters) == 0 && (c.limit <= 0 || c.inflight < c.limit) {
		c.inflight++
		if onGrant != nil {
			onGrant(false)
		}
		c.mu.Unlock()
		return false, nil
	}
	w := &slotWaiter{ready: make(chan struct{}), onGrant: onGrant}
	c.waiters = append(c.waiters, w)
	c.mu.Unlock()
	select {
	case <-w.ready:
		return true, nil
	case <-ctx.Done():
		c.mu.Lock()
		if w.granted { // granted while we were giving up: hand it on
			c.inflight--
			c.grant()
		} else {
			for i, x := range c.waiters {
				if x == w {
					c.waiters = append(c.waiters[:i], c.waiters[i+1:]...)
					break
				}
			}
			c.grant() // the head may have changed
		}
		c.mu.Unlock()
		return true, ctx.Err()
	}
}

// Release gives a slot back.
func (c *ConcurrencyLimiter) Release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight--
	c.grant()
}

func (c *ConcurrencyLimiter) grant() {
	for len(c.waiters) > 0 && (c.limit <= 0 || c.inflight < c.limit) {
		w := c.waiters[0]
		c.waiters[0] = nil
		c.waiters = c.waiters[1:]
		w.granted = true
		c.inflight++
		if w.onGrant != nil {
			w.onGrant(true)
		}
		close(w.ready)
	}
}

// SetLimit changes the limit; a larger limit admits waiters at once, a
// smaller one lets in-flight calls finish and admits no one until below it.
func (c *ConcurrencyLimiter) SetLimit(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limit = n
	c.grant()
}

// Limit, InFlight and Waiting report the current state.
func (c *ConcurrencyLimiter) Limit() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.limit
}

// InFlight reports the slots held.
func (c *ConcurrencyLimiter) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inflight
}

// Waiting reports the callers queued for a slot.
func (c *ConcurrencyLimiter) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}
