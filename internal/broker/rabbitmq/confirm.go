package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
)

// headerPublishID tells the return of a mandatory publish from the others
// in flight on its channel; consumers drop it with the other x-llmq-*.
const headerPublishID = "x-llmq-publish-id"

// maxMandatoryInFlight bounds the mandatory publishes in flight on one
// confirm channel, and so the returns waiting to be matched (see
// confirmChan): amqp091 blocks its reader goroutine while a return
// listener's buffer is full.
const maxMandatoryInFlight = 128

// errUnroutable: a mandatory publish reached no queue (one was deleted).
var errUnroutable = errors.New("unroutable")

// confirmer publishes with publisher confirms over a few shared channels.
// Concurrent publishes pipeline on a channel: amqp091 tracks each
// outstanding confirm by delivery tag (DeferredConfirmation), so no publish
// waits for another's confirm.
type confirmer struct {
	s     *session
	next  atomic.Uint64
	ids   atomic.Uint64
	slots []*confirmSlot
}

type confirmSlot struct {
	mu sync.Mutex
	cc *confirmChan
	// mandatory holds a token per mandatory publish in flight.
	mandatory chan struct{}
}

// confirmChan is a confirm-mode channel and the returns of its mandatory
// publishes. The broker sends an unroutable message's basic.return before
// its basic.ack, and amqp091's reader goroutine hands the return to the
// buffered returns channel before it resolves the confirm; so once a
// publish has its confirm, its return, if any, is in returns or, drained
// there by another publish, in returned.
type confirmChan struct {
	ch      *amqp.Channel
	returns chan amqp.Return

	mu       sync.Mutex
	returned map[string]amqp.Return // by headerPublishID
}

func newConfirmer(s *session) *confirmer {
	c := &confirmer{s: s, slots: make([]*confirmSlot, s.cfg.PublishChannels)}
	for i := range c.slots {
		c.slots[i] = &confirmSlot{mandatory: make(chan struct{}, maxMandatoryInFlight)}
	}
	return c
}

// channel returns the slot's live confirm channel, reopening it (and the
// connection) when it died.
func (c *confirmer) channel(ctx context.Context, slot *confirmSlot) (*confirmChan, error) {
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if slot.cc != nil && !slot.cc.ch.IsClosed() {
		return slot.cc, nil
	}
	conn, err := c.s.connection(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	// Twice the in-flight bound: returns of publishes whose wait was cut
	// short by their ctx also sit there until the next publish drains them.
	returns := ch.NotifyReturn(make(chan amqp.Return, 2*maxMandatoryInFlight))
	slot.cc = &confirmChan{ch: ch, returns: returns, returned: make(map[string]amqp.Return)}
	return slot.cc, nil
}

// takeReturn drains the returns that arrived and removes and returns id's.
func (cc *confirmChan) takeReturn(id string) (amqp.Return, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for drained := false; !drained; {
		select {
		case r, ok := <-cc.returns:
			if !ok {
				drained = true
				break
			}
			if rid, _ := r.Headers[headerPublishID].(string); rid != "" {
				cc.returned[rid] = r
			}
		default:
			drained = true
		}
	}
	r, ok := cc.returned[id]
	delete(cc.returned, id)
	return r, ok
}

// publish returns nil once the broker confirmed pub. A nack on a live
// channel is broker.ErrRejected; a mandatory publish the broker returned
// (no queue bound) is errUnroutable; a channel or connection lost before
// the confirm is retried on a fresh one (at least once: the broker may then
// hold a duplicate) until ctx or PublishTimeout ends.
func (c *confirmer) publish(ctx context.Context, exchange, key string, mandatory bool, pub amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(ctx, c.s.cfg.PublishTimeout)
	defer cancel()
	slot := c.slots[c.next.Add(1)%uint64(len(c.slots))]
	var id string
	if mandatory {
		select {
		case slot.mandatory <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("wait for a publish slot: %w", ctx.Err())
		}
		defer func() { <-slot.mandatory }()
		id = strconv.FormatUint(c.ids.Add(1), 36)
		headers := make(amqp.Table, len(pub.Headers)+1)
		maps.Copy(headers, pub.Headers)
		headers[headerPublishID] = id
		pub.Headers = headers
	}
	var lastErr error
	for attempt := 0; ; attempt++ {
		if attempt > 0 && !c.s.backoff(ctx, attempt) {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(ctx.Err(), context.Canceled) {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
			}
			return broker.ErrClosed
		}
		cc, err := c.channel(ctx, slot)
		if err != nil {
			if errors.Is(err, broker.ErrClosed) || ctx.Err() != nil {
				return err
			}
			lastErr = err
			continue
		}
		retry, err := cc.publishOnce(ctx, exchange, key, id, pub)
		if !retry {
			return err
		}
		lastErr = err
	}
}

// lostOnTheWay reports a publish that failed with its channel or its
// connection, worth another attempt on a new one: the channel is closed,
// or the write to the socket failed before the connection's reader saw
// the broker go (a restart resets the socket under a publish in flight).
// A message whose write failed was not confirmed: sent again, it is at
// worst a duplicate, as after a channel lost before its confirm.
func lostOnTheWay(err error, closed bool) bool {
	var netErr net.Error
	return closed || errors.Is(err, amqp.ErrClosed) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// publishOnce publishes on cc and waits for the confirm; retry reports a
// channel lost on the way (err says how), worth another attempt.
func (cc *confirmChan) publishOnce(ctx context.Context, exchange, key, id string, pub amqp.Publishing) (retry bool, err error) {
	mandatory := id != ""
	dc, err := cc.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, pub)
	if err != nil {
		return lostOnTheWay(err, cc.ch.IsClosed()), err
	}
	if mandatory {
		// Also when the wait ends early: the return must not linger.
		defer func() {
			if r, ok := cc.takeReturn(id); ok && err == nil {
				err = fmt.Errorf("%w: %s (%d)", errUnroutable, r.ReplyText, r.ReplyCode)
			}
		}()
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return false, fmt.Errorf("wait for confirm (outcome unknown): %w", err)
	}
	if ok {
		return false, nil
	}
	if cc.ch.IsClosed() {
		return true, errors.New("channel closed before confirm")
	}
	return false, broker.ErrRejected
}
