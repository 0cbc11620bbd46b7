package flow

import "time"

// Hold closes admission until until as a drain does, without a cut: a
// replica whose share of a shared quota is paused (quota.Coordinator)
// must not send, and that says nothing of what the provider can take, so
// the limit and the watermark stay as they are. Release ends it early.
func (c *Controller) Hold(now, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != StateDrain || !now.Before(c.drainUntil) {
		c.held = true
	}
	if until.After(c.drainUntil) {
		c.drainUntil = until
	}
	c.state = StateDrain
}

// Release ends a hold at now and reports whether it did. A drain that a
// 429 began or joined runs its course.
func (c *Controller) Release(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	holding := c.held && c.state == StateDrain && now.Before(c.drainUntil)
	c.held = false
	if !holding {
		return false
	}
	c.drainUntil = now
	c.state = StateProbing
	return true
}
