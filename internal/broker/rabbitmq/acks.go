package rabbitmq

import (
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// consumeChan is one AMQP channel of a subscription and the deliveries it
// handed out and are not settled yet.
//
// Acks are coalesced. Every tag the channel delivered is listed in
// unsettled, in delivery order, until its settlement frame is sent. An ack
// of the oldest unsettled tag is sent at once, as one basic.ack with
// multiple=true that also carries every ack requested for the tags right
// behind it; an ack requested for a tag behind one still in hand (jobs
// finish out of order) waits in ready until the tags before it are
// settled, or at most ackDelay, and is then sent. For a quorum queue each
// ack frame is a settle command in its Raft log, and an out-of-order ack
// makes the channel search its unacked list, so coalescing saves most of
// the broker's work per message. Deferred acks hold prefetch slots, so
// once half the prefetch waits they all go out. A deferred ack is never
// lost silently: drain and the subscriber's Close send the pending ones
// first; if the channel dies before they are sent, the broker delivers
// those messages again, as for any unsettled delivery.
type consumeChan struct {
	ch       ackChannel
	ackDelay time.Duration

	mu       sync.Mutex
	pending  int
	draining bool
	// unsettled: tags delivered whose settlement frame is not sent, in
	// delivery order; a tag settled out of order (Nack, a single ack) stays
	// here until the tags before it are settled, and is in early meanwhile.
	unsettled []uint64
	early     map[uint64]struct{}
	ready     map[uint64]struct{} // acks requested, frame not sent yet
	timer     *time.Timer         // sends ready; armed while ready is not empty
	// maxDeferred caps ready: deferred acks hold prefetch slots, so at half
	// the prefetch they all go out at once.
	maxDeferred int
	noDefer     bool // set by flush: acks go out at once
}

// ackChannel is what consumeChan uses of its *amqp.Channel.
type ackChannel interface {
	Ack(tag uint64, multiple bool) error
	IsClosed() bool
	Close() error
	Cancel(consumer string, noWait bool) error
}

// received records a tag the channel delivered; tags must be recorded in
// delivery order, before the delivery can be settled.
func (c *consumeChan) received(tag uint64) {
	c.mu.Lock()
	c.unsettled = append(c.unsettled, tag)
	c.mu.Unlock()
}

// settleOne sends the settlement of one tag (send) and records it. Every
// frame is sent under mu, so that no multiple ack can pass a settlement
// that is recorded but not yet sent.
func (c *consumeChan) settleOne(tag uint64, send func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := send()
	c.markSettled(tag)
	if len(c.ready) > 0 {
		// Acks waiting behind tag may be at the head now.
		_ = c.sendHeadRun()
		c.stopTimerIfIdle()
	}
	return err
}

// stopTimerIfIdle disarms the timer when no ack waits. Caller holds mu.
func (c *consumeChan) stopTimerIfIdle() {
	if len(c.ready) == 0 && c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

// markSettled records that tag's settlement was sent. Caller holds mu.
func (c *consumeChan) markSettled(tag uint64) {
	if len(c.unsettled) > 0 && c.unsettled[0] == tag {
		c.unsettled = c.unsettled[1:]
		c.popEarly()
		return
	}
	if c.early == nil {
		c.early = make(map[uint64]struct{})
	}
	c.early[tag] = struct{}{}
}

// popEarly drops the settled tags at the head of unsettled. Caller holds mu.
func (c *consumeChan) popEarly() {
	for len(c.unsettled) > 0 {
		if _, ok := c.early[c.unsettled[0]]; !ok {
			return
		}
		delete(c.early, c.unsettled[0])
		c.unsettled = c.unsettled[1:]
	}
}

// ack requests the ack of tags (distinct, delivered on this channel, not
// settled). It fails only when the channel is already closed (the broker
// delivers those messages again); otherwise the acks are sent now or, unless
// now is set, within ackDelay.
func (c *consumeChan) ack(tags []uint64, now bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch.IsClosed() {
		return amqp.ErrClosed
	}
	if c.ready == nil {
		c.ready = make(map[uint64]struct{}, len(tags))
	}
	for _, t := range tags {
		c.ready[t] = struct{}{}
	}
	err := c.sendHeadRun()
	if len(c.ready) == 0 {
		c.stopTimerIfIdle()
		return err
	}
	if now || c.noDefer || c.ackDelay <= 0 || len(c.ready) >= c.maxDeferred {
		c.sendReady()
		return err
	}
	if c.timer == nil {
		c.timer = time.AfterFunc(c.ackDelay, c.flush)
	}
	return err
}

// sendHeadRun sends one ack for the run of ready (and already settled)
// tags at the head of unsettled. Caller holds mu.
func (c *consumeChan) sendHeadRun() error {
	var last uint64
	run, n := 0, 0
	for k, t := range c.unsettled {
		if _, ok := c.ready[t]; ok {
			last, run = t, k+1
			n++
			continue
		}
		if _, ok := c.early[t]; !ok {
			break
		}
	}
	if n == 0 {
		return nil
	}
	err := c.ch.Ack(last, n > 1)
	for _, t := range c.unsettled[:run] {
		delete(c.ready, t)
		delete(c.early, t)
	}
	c.unsettled = c.unsettled[run:]
	c.popEarly()
	return err
}

// sendReady sends every requested ack: the head run in one frame, the
// others one by one. Caller holds mu.
func (c *consumeChan) sendReady() {
	_ = c.sendHeadRun()
	rest := make([]uint64, 0, len(c.ready))
	for t := range c.ready {
		rest = append(rest, t)
	}
	slices.Sort(rest)
	for _, t := range rest {
		_ = c.ch.Ack(t, false)
		c.markSettled(t)
	}
	clear(c.ready)
	c.stopTimerIfIdle()
}

// flush sends the deferred acks (the timer's function).
func (c *consumeChan) flush() {
	c.mu.Lock()
	c.sendReady()
	c.mu.Unlock()
}

// flushForClose sends the deferred acks and makes later acks go out at
// once: the connection is about to close.
func (c *consumeChan) flushForClose() {
	c.mu.Lock()
	c.noDefer = true
	c.sendReady()
	c.mu.Unlock()
}

// settled accounts one settled delivery; a draining channel closes once its
// last delivery is settled.
func (c *consumeChan) settled() {
	c.mu.Lock()
	c.pending--
	closeNow := c.draining && c.pending == 0
	if closeNow {
		c.sendReady()
	}
	c.mu.Unlock()
	if closeNow {
		_ = c.ch.Close()
	}
}

func (c *consumeChan) drain() {
	c.mu.Lock()
	c.draining = true
	closeNow := c.pending == 0
	if closeNow {
		c.sendReady()
	}
	c.mu.Unlock()
	if closeNow {
		_ = c.ch.Close()
	}
}
