package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// confirmer publishes with publisher confirms over a few shared channels.
// Concurrent publishes pipeline on a channel: amqp091 tracks each
// outstanding confirm by delivery tag (DeferredConfirmation), so no publish
// waits for another's confirm.
type confirmer struct {
	s     *session
	next  atomic.Uint64
	slots []*confirmSlot
}

type confirmSlot struct {
	mu sync.Mutex
	ch *amqp.Channel
}

func newConfirmer(s *session) *confirmer {
	c := &confirmer{s: s, slots: make([]*confirmSlot, s.cfg.PublishChannels)}
	for i := range c.slots {
		c.slots[i] = &confirmSlot{}
	}
	return c
}

// channel returns the slot's live confirm channel, reopening it (and the
// connection) when it died.
func (c *confirmer) channel(ctx context.Context, slot *confirmSlot) (*amqp.Channel, error) {
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if slot.ch != nil && !slot.ch.IsClosed() {
		return slot.ch, nil
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
	slot.ch = ch
	return ch, nil
}

// publish returns nil once the broker confirmed pub. A nack on a live
// channel is broker.ErrRejected; a channel or connection lost before the
// confirm is retried on a fresh one (at least once: the broker may then hold
// a duplicate) until ctx or PublishTimeout ends.
func (c *confirmer) publish(ctx context.Context, exchange, key string, pub amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(ctx, c.s.cfg.PublishTimeout)
	defer cancel()
	slot := c.slots[c.next.Add(1)%uint64(len(c.slots))]
	var lastErr error
	for attempt := 0; ; attempt++ {
		if attempt > 0 && !c.s.backoff(ctx, attempt) {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(ctx.Err(), context.Canceled) {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
			}
			return broker.ErrClosed
		}
		ch, err := c.channel(ctx, slot)
		if err != nil {
			if errors.Is(err, broker.ErrClosed) || ctx.Err() != nil {
				return err
			}
			lastErr = err
			continue
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, pub)
		if err != nil {
			if ch.IsClosed() || errors.Is(err, amqp.ErrClosed) {
				lastErr = err
				continue
			}
			return err
		}
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("wait for confirm (outcome unknown): %w", err)
		}
		if ok {
			return nil
		}
		if ch.IsClosed() {
			lastErr = errors.New("channel closed before confirm")
			continue
		}
		return broker.ErrRejected
	}
}

// Publisher publishes jobs and status documents.
type Publisher struct {
	s      *session
	c      *confirmer
	closed atomic.Bool
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher connects (declaring the topology) and returns a Publisher.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := newSession(cfg, "publisher")
	if _, err := s.connection(ctx); err != nil {
		s.close()
		return nil, fmt.Errorf("rabbitmq publisher: %w", err)
	}
	return &Publisher{s: s, c: newConfirmer(s)}, nil
}

// Publish sends msg to exchange llmq.jobs with routing key lane and returns
// once the broker confirmed it.
func (p *Publisher) Publish(ctx context.Context, lane job.Priority, msg broker.Message) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	if !lane.Valid() {
		return fmt.Errorf("rabbitmq: publish %s: unknown lane %q", msg.Key, lane)
	}
	if err := p.c.publish(ctx, p.s.names.jobs, string(lane), publishing(msg, nil)); err != nil {
		return fmt.Errorf("rabbitmq: publish %s to %s: %w", msg.Key, lane, err)
	}
	return nil
}

// PublishStatus broadcasts body on the llmq.status fanout exchange.
func (p *Publisher) PublishStatus(ctx context.Context, body []byte) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	pub := amqp.Publishing{ContentType: "application/json", Body: body, Timestamp: time.Now()}
	if err := p.c.publish(ctx, p.s.names.status, "", pub); err != nil {
		return fmt.Errorf("rabbitmq: publish status: %w", err)
	}
	return nil
}

// Close closes the connection; later publishes return broker.ErrClosed.
func (p *Publisher) Close() error {
	p.closed.Store(true)
	p.s.close()
	return nil
}

// publishing turns a message into a persistent AMQP publishing; extra
// (driver) headers are added after the message's own.
func publishing(msg broker.Message, extra amqp.Table) amqp.Publishing {
	var headers amqp.Table
	if len(msg.Headers)+len(extra) > 0 {
		headers = make(amqp.Table, len(msg.Headers)+len(extra))
		for k, v := range msg.Headers {
			headers[k] = v
		}
		for k, v := range extra {
			headers[k] = v
		}
	}
	return amqp.Publishing{
		MessageId:    msg.Key,
		DeliveryMode: amqp.Persistent,
		Headers:      headers,
		Body:         msg.Body,
	}
}

// dueAt reads broker.HeaderDueAt (Unix ms) from headers.
func dueAt(h amqp.Table) (time.Time, bool) {
	v, ok := h[broker.HeaderDueAt].(string)
	if !ok {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}
