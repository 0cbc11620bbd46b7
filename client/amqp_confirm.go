package client

import (
	"context"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// headerPublishID tells the return of one mandatory publish from those of
// the others in flight on its channel (llmq's own producer sets it too;
// llmq's consumers ignore x-llmq-* headers).
const headerPublishID = "x-llmq-publish-id"

// maxInFlight bounds the publishes in flight on one channel, and so the
// returns waiting to be matched: amqp091's reader goroutine blocks while a
// return listener's buffer is full.
const maxInFlight = 256

// confirmChannel is a channel in confirm mode and the returns of its
// mandatory publishes.
type confirmChannel struct {
	ch      *amqp.Channel
	closes  chan *amqp.Error
	returns chan amqp.Return
	slots   chan struct{} // a token per publish in flight

	mu       sync.Mutex
	returned map[string]amqp.Return // by headerPublishID
	closeErr *amqp.Error
}

func newConfirmChannel(ch *amqp.Channel) (*confirmChannel, error) {
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	return &confirmChannel{
		ch:     ch,
		closes: ch.NotifyClose(make(chan *amqp.Error, 1)),
		// Twice the in-flight bound: the returns of publishes whose wait
		// ended early also sit there until the next publish drains them.
		returns:  ch.NotifyReturn(make(chan amqp.Return, 2*maxInFlight)),
		slots:    make(chan struct{}, maxInFlight),
		returned: make(map[string]amqp.Return),
	}, nil
}

// publish sends msg (mandatory, its headerPublishID set) to the intake with
// routing key and waits for its confirm.
func (cc *confirmChannel) publish(ctx context.Context, key string, msg amqp.Publishing) (err error) {
	select {
	case cc.slots <- struct{}{}:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	defer func() { <-cc.slots }()
	id, _ := msg.Headers[headerPublishID].(string)
	dc, err := cc.ch.PublishWithDeferredConfirmWithContext(ctx, IntakeExchange, key, true, false, msg)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	// RabbitMQ sends an unroutable message's basic.return before its
	// basic.ack, and amqp091 hands the return to the listener before it
	// resolves the confirm: once the confirm is in, the return, if any, is
	// in returns or, drained there by another publish, in returned. It is
	// taken even when the wait ends early, so that it does not linger.
	defer func() {
		if r, ok := cc.takeReturn(id); ok && err == nil {
			err = fmt.Errorf("%w: RabbitMQ returned it: %s", ErrUnroutable, r.ReplyText)
		}
	}()
	ok, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("no confirm (the job may or may not be queued): %w", err)
	case ok:
		return nil
	case !cc.ch.IsClosed():
		return ErrRejected
	}
	reason := cc.closeReason()
	if reason != nil && reason.Code == amqp.NotFound {
		return fmt.Errorf("%w: %s", ErrUnroutable, reason.Reason)
	}
	return fmt.Errorf("the channel closed before the confirm (the job may or may not be queued): %v", reason)
}

// takeReturn drains the returns that arrived and removes and returns id's.
func (cc *confirmChannel) takeReturn(id string) (amqp.Return, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
drain:
	for {
		select {
		case r, ok := <-cc.returns:
			if !ok {
				break drain
			}
			if rid, _ := r.Headers[headerPublishID].(string); rid != "" {
				cc.returned[rid] = r
			}
		default:
			break drain
		}
	}
	r, ok := cc.returned[id]
	delete(cc.returned, id)
	return r, ok
}

// closeReason is why the channel closed: RabbitMQ's error, or nil for a
// clean close.
func (cc *confirmChannel) closeReason() *amqp.Error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	select {
	case e, ok := <-cc.closes:
		if ok {
			cc.closeErr = e
		}
	default:
	}
	return cc.closeErr
}
