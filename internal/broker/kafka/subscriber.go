package kafka

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Subscriber consumes lanes (a consumer group per lane) and runs the retry
// forwarder.
type Subscriber struct {
	cfg Config
	w   *kafkago.Writer
	wg  sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	subs    []*subscription
	cancels []context.CancelFunc
	fwd     *forwarder
}

var _ broker.Subscriber = (*Subscriber)(nil)

// NewSubscriber creates missing topics and returns a Subscriber.
func NewSubscriber(ctx context.Context, cfg Config) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := ensureTopics(ctx, cfg); err != nil {
		return nil, fmt.Errorf("kafka subscriber: %w", err)
	}
	return &Subscriber{cfg: cfg, w: newWriter(cfg)}, nil
}

// Subscribe consumes the lane with at most prefetch unsettled deliveries,
// processed concurrently even within one partition.
func (s *Subscriber) Subscribe(ctx context.Context, lane job.Priority, prefetch int) (<-chan broker.Delivery, error) {
	if !lane.Valid() {
		return nil, fmt.Errorf("kafka: subscribe: unknown lane %q", lane)
	}
	if prefetch < 1 {
		prefetch = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, broker.ErrClosed
	}
	if s.fwd == nil {
		fctx, cancel := context.WithCancel(context.Background())
		s.cancels = append(s.cancels, cancel)
		s.fwd = newForwarder(s)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.fwd.run(fctx)
		}()
	}
	sub := &subscription{
		owner: s, lane: lane,
		gc:          newGroupConsumer(s.cfg, s.cfg.laneTopic(lane), s.cfg.laneGroup(lane)),
		slots:       make(chan struct{}, prefetch),
		outstanding: make(map[*delivery]struct{}),
	}
	s.subs = append(s.subs, sub)
	sctx, cancel := context.WithCancel(ctx)
	s.cancels = append(s.cancels, cancel)
	out := make(chan broker.Delivery)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		sub.run(sctx, out)
	}()
	return out, nil
}

// Close stops every subscription and the forwarder, hands unsettled
// deliveries back (their offsets stay uncommitted, so they are read again)
// and leaves the groups.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for _, cancel := range s.cancels {
		cancel()
	}
	subs := s.subs
	s.mu.Unlock()
	s.wg.Wait()
	if s.fwd != nil {
		s.fwd.stop()
	}
	for _, sub := range subs {
		sub.handBackAll()
		if err := sub.gc.close(); err != nil {
			s.cfg.Logger.Warn("kafka close reader", "lane", sub.lane, "error", err)
		}
	}
	if s.fwd != nil {
		_ = s.fwd.gc.close()
	}
	if err := closeWriter(s.w); err != nil {
		return fmt.Errorf("kafka: close subscriber: %w", err)
	}
	return nil
}

type subscription struct {
	owner *Subscriber
	lane  job.Priority
	gc    *groupConsumer
	slots chan struct{}

	mu          sync.Mutex
	outstanding map[*delivery]struct{}
}

func (sub *subscription) run(ctx context.Context, out chan<- broker.Delivery) {
	for attempt := 0; ; {
		select {
		case sub.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		m, tr, err := sub.gc.fetch(ctx)
		if err != nil {
			<-sub.slots
			if ctx.Err() != nil {
				return
			}
			attempt++
			sub.owner.cfg.Logger.Warn("kafka fetch failed", "lane", sub.lane, "attempt", attempt, "error", err)
			if !sleep(ctx, time.Duration(min(attempt, 20))*100*time.Millisecond) {
				return
			}
			continue
		}
		attempt = 0
		msg, internal := messageOf(m)
		d := &delivery{sub: sub, m: m, tr: tr, msg: msg, redelivered: internal[broker.HeaderRedelivered] != ""}
		sub.mu.Lock()
		sub.outstanding[d] = struct{}{}
		sub.mu.Unlock()
		select {
		case out <- d:
		case <-ctx.Done():
			d.handBack()
			return
		}
	}
}

// handBackAll makes every unsettled delivery unsettleable; their offsets
// are never committed.
func (sub *subscription) handBackAll() {
	sub.mu.Lock()
	ds := make([]*delivery, 0, len(sub.outstanding))
	for d := range sub.outstanding {
		ds = append(ds, d)
	}
	sub.mu.Unlock()
	for _, d := range ds {
		d.handBack()
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

type deliveryState int

const (
	pending deliveryState = iota
	settled
	returned
)

type delivery struct {
	sub         *subscription
	m           kafkago.Message
	tr          *offsetTracker
	msg         broker.Message
	redelivered bool

	mu    sync.Mutex
	state deliveryState
}

var _ broker.Delivery = (*delivery)(nil)

func (d *delivery) Message() broker.Message { return d.msg }
func (d *delivery) Lane() job.Priority      { return d.sub.lane }

// Redelivered is exact after a Nack (the re-published message carries a
// header) and false for a message re-read after a crash or rebalance.
func (d *delivery) Redelivered() bool { return d.redelivered }

func (d *delivery) settle(op string, publish func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch d.state {
	case settled:
		return broker.ErrSettled
	case returned:
		return fmt.Errorf("kafka: %s %s: subscriber closed, the message is read again: %w", op, d.msg.Key, broker.ErrClosed)
	}
	if publish != nil {
		if err := publish(); err != nil {
			return fmt.Errorf("kafka: %s %s: %w", op, d.msg.Key, err)
		}
	}
	d.state = settled
	d.done()
	return nil
}

// done frees the prefetch slot and lets the offset be committed.
func (d *delivery) done() {
	sub := d.sub
	sub.mu.Lock()
	delete(sub.outstanding, d)
	sub.mu.Unlock()
	sub.gc.finish(d.tr, d.m.Partition, d.m.Offset)
	<-sub.slots
}

func (d *delivery) handBack() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != pending {
		return
	}
	d.state = returned
	sub := d.sub
	sub.mu.Lock()
	delete(sub.outstanding, d)
	sub.mu.Unlock()
	<-sub.slots
}

func (d *delivery) Ack(ctx context.Context) error { return d.settle("ack", nil) }

// Nack re-publishes the message to its lane, then marks this one done.
func (d *delivery) Nack(ctx context.Context) error {
	return d.settle("nack", func() error {
		cfg := d.sub.owner.cfg
		return write(ctx, d.sub.owner.w, record(cfg.laneTopic(d.sub.lane), d.msg,
			map[string]string{broker.HeaderRedelivered: "1"}))
	})
}

func (d *delivery) Retry(ctx context.Context, delay time.Duration, headers map[string]string) error {
	msg := d.msg
	msg.Headers = broker.MergeHeaders(d.msg.Headers, headers)
	return d.settle("retry", func() error {
		cfg := d.sub.owner.cfg
		if delay <= 0 {
			return write(ctx, d.sub.owner.w, record(cfg.laneTopic(d.sub.lane), msg, nil))
		}
		due := time.Now().Add(delay)
		return write(ctx, d.sub.owner.w, record(cfg.retryTopic(), msg, map[string]string{
			broker.HeaderDueAt: strconv.FormatInt(due.UnixMilli(), 10),
			headerLane:         string(d.sub.lane),
		}))
	})
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
	return d.settle("dead-letter", func() error {
		body, err := json.Marshal(dl)
		if err != nil {
			return fmt.Errorf("encode envelope: %w", err)
		}
		return write(ctx, d.sub.owner.w, kafkago.Message{
			Topic: d.sub.owner.cfg.deadTopic(), Key: []byte(dl.Key), Value: body,
		})
	})
}
