package rabbitmq

import (
	"context"
	"encoding/json"
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

// Subscriber consumes lanes, one AMQP channel (with its own prefetch) per
// subscription, and publishes retries and dead letters with confirms on its
// own connection.
type Subscriber struct {
	s   *session
	pub *confirmer
	wg  sync.WaitGroup

	mu     sync.Mutex
	closed bool
	seq    int
}

var _ broker.Subscriber = (*Subscriber)(nil)

// NewSubscriber connects (declaring the topology) and returns a Subscriber.
func NewSubscriber(ctx context.Context, cfg Config) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := newSession(cfg, "subscriber")
	if _, err := s.connection(ctx); err != nil {
		s.close()
		return nil, fmt.Errorf("rabbitmq subscriber: %w", err)
	}
	return &Subscriber{s: s, pub: newConfirmer(s)}, nil
}

// Subscribe consumes the lane's quorum queue with at most prefetch
// unsettled deliveries. The channel keeps delivering across reconnects and
// closes when ctx ends (deliveries in hand stay settleable until Close) or
// on Close.
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
	s.mu.Unlock()
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

// consumeChan is one AMQP channel of a subscription and the deliveries it
// handed out and are not settled yet.
type consumeChan struct {
	ch       *amqp.Channel
	mu       sync.Mutex
	pending  int
	draining bool
}

// settled accounts one settled delivery; a draining channel closes once its
// last delivery is settled.
func (c *consumeChan) settled() {
	c.mu.Lock()
	c.pending--
	closeNow := c.draining && c.pending == 0
	c.mu.Unlock()
	if closeNow {
		_ = c.ch.Close()
	}
}

func (c *consumeChan) drain() {
	c.mu.Lock()
	c.draining = true
	closeNow := c.pending == 0
	c.mu.Unlock()
	if closeNow {
		_ = c.ch.Close()
	}
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
	return &consumeChan{ch: ch}, msgs, nil
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
		if due, ok := dueAt(m.Headers); ok && time.Until(due) > 0 {
			sub.retier(ctx, m, due)
			continue
		}
		cc.mu.Lock()
		cc.pending++
		cc.mu.Unlock()
		d := &delivery{sub: sub, cc: cc, m: m, msg: messageOf(m)}
		select {
		case out <- d:
		case <-ctx.Done():
			_ = m.Nack(false, true)
			cc.settled()
			return stop()
		case <-sub.owner.s.done:
			return true
		}
	}
}

// retier sends a delayed retry that arrived before its due time back to the
// retry tier that fits the time left.
func (sub *subscription) retier(ctx context.Context, m amqp.Delivery, due time.Time) {
	msg := messageOf(m)
	if err := sub.publishDelayed(ctx, msg, due); err != nil {
		sub.owner.s.cfg.Logger.Warn("rabbitmq re-tier failed", "lane", sub.lane, "job_id", msg.Key, "error", err)
		_ = m.Nack(false, true)
		return
	}
	_ = m.Ack(false)
}

// publishDelayed publishes msg to the retry tier for the time left to due.
func (sub *subscription) publishDelayed(ctx context.Context, msg broker.Message, due time.Time) error {
	s := sub.owner.s
	tier := broker.PickTier(s.cfg.RetryTiers, time.Until(due))
	extra := amqp.Table{
		headerTier:         tierName(tier),
		broker.HeaderDueAt: strconv.FormatInt(due.UnixMilli(), 10),
	}
	return sub.owner.pub.publish(ctx, s.names.retry, string(sub.lane), publishing(msg, extra))
}

// messageOf is the broker.Message of a delivery; broker headers
// (x-death, x-delivery-count, …) and llmq's own x-llmq-* are left out.
func messageOf(m amqp.Delivery) broker.Message {
	msg := broker.Message{Key: m.MessageId, Body: m.Body}
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

type delivery struct {
	sub *subscription
	cc  *consumeChan
	m   amqp.Delivery
	msg broker.Message

	mu   sync.Mutex
	done bool
}

var _ broker.Delivery = (*delivery)(nil)

func (d *delivery) Message() broker.Message { return d.msg }
func (d *delivery) Lane() job.Priority      { return d.sub.lane }

// Redelivered is the AMQP redelivered flag (quorum queues also count
// deliveries in x-delivery-count).
func (d *delivery) Redelivered() bool {
	if d.m.Redelivered {
		return true
	}
	switch n := d.m.Headers["x-delivery-count"].(type) {
	case int64:
		return n > 0
	case int32:
		return n > 0
	}
	return false
}

// settle runs publish (if any), then settle, exactly once. A settle that
// fails because the channel is gone leaves the message with the broker,
// which delivers it again; the delivery is then finished too.
func (d *delivery) settle(op string, publish func() error, settle func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return broker.ErrSettled
	}
	if publish != nil {
		if err := publish(); err != nil {
			return fmt.Errorf("rabbitmq: %s %s: %w", op, d.msg.Key, err)
		}
	}
	err := settle()
	d.done = true
	d.cc.settled()
	if err != nil {
		return fmt.Errorf("rabbitmq: %s %s: channel lost, the broker delivers it again: %w: %v",
			op, d.msg.Key, broker.ErrClosed, err)
	}
	return nil
}

func (d *delivery) Ack(ctx context.Context) error {
	return d.settle("ack", nil, func() error { return d.m.Ack(false) })
}

func (d *delivery) Nack(ctx context.Context) error {
	return d.settle("nack", nil, func() error { return d.m.Nack(false, true) })
}

func (d *delivery) Retry(ctx context.Context, delay time.Duration, headers map[string]string) error {
	msg := d.msg
	msg.Headers = broker.MergeHeaders(d.msg.Headers, headers)
	publish := func() error {
		if delay <= 0 {
			s := d.sub.owner.s
			return d.sub.owner.pub.publish(ctx, s.names.jobs, string(d.sub.lane), publishing(msg, nil))
		}
		return d.sub.publishDelayed(ctx, msg, time.Now().Add(delay))
	}
	return d.settle("retry", publish, func() error { return d.m.Ack(false) })
}

func (d *delivery) DeadLetter(ctx context.Context, dl broker.DeadLetter) error {
	if dl.Body == nil {
		dl.Body = d.msg.Body
	}
	if dl.Key == "" {
		dl.Key = d.msg.Key
	}
	if dl.Lane == "" {
		dl.Lane = d.sub.lane
	}
	publish := func() error {
		body, err := json.Marshal(dl)
		if err != nil {
			return fmt.Errorf("encode envelope: %w", err)
		}
		s := d.sub.owner.s
		pub := amqp.Publishing{
			MessageId: dl.Key, DeliveryMode: amqp.Persistent, ContentType: "application/json",
			Headers: amqp.Table{headerEnvelope: "1"}, Body: body,
		}
		return d.sub.owner.pub.publish(ctx, s.names.dlx, string(dl.Lane), pub)
	}
	return d.settle("dead-letter", publish, func() error { return d.m.Ack(false) })
}
