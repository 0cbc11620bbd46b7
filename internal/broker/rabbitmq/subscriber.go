package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Subscriber consumes the lane queues (NewSubscriber, the workers') or the
// intake queues (NewIntakeSubscriber, the ingester's), one AMQP channel
// (with its own prefetch) per subscription, and publishes retries and dead
// letters with confirms on its own connection.
type Subscriber struct {
	s      *session
	pub    *confirmer
	intake bool // consumes the intake queues, not the lanes
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	seq    int
	chans  map[*consumeChan]struct{} // open consume channels (Close flushes their acks)
}

var _ broker.Subscriber = (*Subscriber)(nil)

// NewSubscriber connects (declaring the topology) and returns a Subscriber
// on the internal lane queues llmq.lane.<priority>.
func NewSubscriber(ctx context.Context, cfg Config) (*Subscriber, error) {
	return newSubscriber(ctx, cfg, false)
}

// NewIntakeSubscriber connects (declaring the topology) and returns a
// Subscriber on the intake queues llmq.jobs.<priority>. Its deliveries
// settle as lane deliveries do, except Retry, which hands them back (see
// broker.Delivery).
func NewIntakeSubscriber(ctx context.Context, cfg Config) (*Subscriber, error) {
	return newSubscriber(ctx, cfg, true)
}

func newSubscriber(ctx context.Context, cfg Config, intake bool) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	role := "subscriber"
	if intake {
		role = "intake-subscriber"
	}
	s := newSession(cfg, role)
	if _, err := s.connection(ctx); err != nil {
		s.close()
		return nil, fmt.Errorf("rabbitmq %s: %w", role, err)
	}
	return &Subscriber{s: s, pub: newConfirmer(s), intake: intake}, nil
}

// Subscribe consumes the priority's lane (or intake) quorum queue with at
// most prefetch unsettled deliveries. The channel keeps delivering across
// reconnects and closes when ctx ends (deliveries in hand stay settleable
// until Close) or on Close.
func (s *Subscriber) Subscribe(ctx context.Context, lane job.Priority, prefetch int) (<-chan broker.Delivery, error) {
	if !lane.Valid() {
		return nil, fmt.Errorf("rabbitmq: subscribe: unknown lane %q", lane)
	}
	if prefetch < 1 {
		prefetch = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, broker.ErrClosed
	}
	s.seq++
	sub := &subscription{
		owner: s, lane: lane, prefetch: prefetch, queue: s.s.names.lane(lane),
		tag: fmt.Sprintf("llmq-%s-%d", lane, s.seq),
	}
	if s.intake {
		sub.queue, sub.tag = s.s.names.intake(lane), fmt.Sprintf("llmq-intake-%s-%d", lane, s.seq)
	}
	out := make(chan broker.Delivery)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		sub.run(ctx, out)
	}()
	return out, nil
}

// Close stops every subscription and closes the connection: the broker
// takes back every unsettled delivery, and settling one afterwards fails.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	chans := s.chans
	s.chans = nil
	s.mu.Unlock()
	for cc := range chans {
		cc.flushForClose()
	}
	s.s.close()
	s.wg.Wait()
	return nil
}

type subscription struct {
	owner    *Subscriber
	lane     job.Priority
	prefetch int
	queue    string
	tag      string
}

func (sub *subscription) run(ctx context.Context, out chan<- broker.Delivery) {
	log := sub.owner.s.cfg.Logger
	for attempt := 0; ; attempt++ {
		if attempt > 0 && !sub.owner.s.backoff(ctx, attempt) {
			return
		}
		cc, msgs, err := sub.open(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, broker.ErrClosed) {
				return
			}
			log.Warn("rabbitmq subscribe failed", "lane", sub.lane, "attempt", attempt, "error", err)
			continue
		}
		if attempt > 0 {
			log.Info("rabbitmq subscription resumed", "lane", sub.lane)
		}
		attempt = 0
		if sub.consume(ctx, cc, msgs, out) {
			return
		}
		sub.owner.forget(cc)
		log.Warn("rabbitmq subscription lost, reconnecting", "lane", sub.lane)
	}
}

func (sub *subscription) open(ctx context.Context) (*consumeChan, <-chan amqp.Delivery, error) {
	conn, err := sub.owner.s.connection(ctx)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(sub.prefetch, 0, false); err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("qos: %w", err)
	}
	msgs, err := ch.Consume(sub.queue, sub.tag, false, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("consume %s: %w", sub.queue, err)
	}
	cc := &consumeChan{ch: ch, ackDelay: sub.owner.s.cfg.AckDelay, maxDeferred: max(sub.prefetch/2, 1)}
	o := sub.owner
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		_ = ch.Close()
		return nil, nil, broker.ErrClosed
	}
	if o.chans == nil {
		o.chans = make(map[*consumeChan]struct{})
	}
	o.chans[cc] = struct{}{}
	o.mu.Unlock()
	return cc, msgs, nil
}

// forget drops a consume channel that is gone from the Close list.
func (s *Subscriber) forget(cc *consumeChan) {
	s.mu.Lock()
	delete(s.chans, cc)
	s.mu.Unlock()
}

// consume hands msgs out until the channel is lost (false) or ctx ends or
// the subscriber closes (true).
func (sub *subscription) consume(ctx context.Context, cc *consumeChan, msgs <-chan amqp.Delivery, out chan<- broker.Delivery) bool {
	stop := func() bool {
		// No new deliveries; those in hand stay settleable until the
		// channel drains or the subscriber closes.
		_ = cc.ch.Cancel(sub.tag, false)
		for m := range msgs {
			_ = m.Nack(false, true)
		}
		cc.drain()
		return true
	}
	for {
		var m amqp.Delivery
		var ok bool
		select {
		case m, ok = <-msgs:
			if !ok {
				return false
			}
		case <-ctx.Done():
			return stop()
		case <-sub.owner.s.done:
			return true
		}
		if cc.ch.IsClosed() {
			// Buffered from a channel that is gone: the broker has taken it
			// back and delivers it again on the next channel.
			continue
		}
		cc.received(m.DeliveryTag)
		// On the intake too: a retry left in a retry queue of an earlier
		// version arrives there, and re-tiering sends it to its lane on time.
		if due, ok := dueAt(m.Headers); ok && time.Until(due) > 0 {
			sub.retier(ctx, cc, m, due)
			continue
		}
		cc.mu.Lock()
		cc.pending++
		cc.mu.Unlock()
		d := &delivery{sub: sub, cc: cc, m: m, msg: messageOf(m)}
		select {
		case out <- d:
		case <-ctx.Done():
			_ = cc.settleOne(m.DeliveryTag, func() error { return m.Nack(false, true) })
			cc.settled()
			return stop()
		case <-sub.owner.s.done:
			return true
		}
	}
}

// retier sends a delayed retry that arrived before its due time back to the
// delay tier that fits the time left.
func (sub *subscription) retier(ctx context.Context, cc *consumeChan, m amqp.Delivery, due time.Time) {
	msg := messageOf(m)
	if err := sub.publishDelayed(ctx, msg, due); err != nil {
		sub.owner.s.cfg.Logger.Warn("rabbitmq re-tier failed", "lane", sub.lane, "job_id", msg.Key, "error", err)
		_ = cc.settleOne(m.DeliveryTag, func() error { return m.Nack(false, true) })
		return
	}
	_ = cc.settleOne(m.DeliveryTag, func() error { return m.Ack(false) })
}

// publishDelayed publishes msg to the delay tier for the time left to due;
// from there it reaches the priority's lane.
func (sub *subscription) publishDelayed(ctx context.Context, msg broker.Message, due time.Time) error {
	s := sub.owner.s
	tier := broker.PickTier(s.cfg.RetryTiers, time.Until(due))
	extra := amqp.Table{
		headerTier:         tierName(tier),
		broker.HeaderDueAt: strconv.FormatInt(due.UnixMilli(), 10),
	}
	return sub.owner.pub.publish(ctx, s.names.delay, string(sub.lane), true, publishing(msg, extra))
}

// messageOf is the broker.Message of a delivery; broker headers
// (x-death, x-delivery-count, …) and llmq's own x-llmq-* are left out.
// UserID is user_id as RabbitMQ validated it against the publisher's user.
func messageOf(m amqp.Delivery) broker.Message {
	msg := broker.Message{Key: m.MessageId, Body: m.Body, ReplyTo: m.ReplyTo, CorrelationID: m.CorrelationId, UserID: m.UserId}
	for k, v := range m.Headers {
		if strings.HasPrefix(k, "x-llmq-") || k == headerTier || strings.HasPrefix(k, "x-death") ||
			strings.HasPrefix(k, "x-first-death") || strings.HasPrefix(k, "x-last-death") ||
			k == "x-delivery-count" {
			continue
		}
		if s, ok := v.(string); ok {
			if msg.Headers == nil {
				msg.Headers = make(map[string]string)
			}
			msg.Headers[k] = s
		}
	}
	return msg
}
