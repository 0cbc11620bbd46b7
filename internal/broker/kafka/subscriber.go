package kafka

import (
	"context"
	"fmt"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Subscriber consumes the lane topics (NewSubscriber, the workers'; it
// also runs the retry forwarder) or the intake topics (NewIntakeSubscriber,
// the ingester's), a consumer group per topic.
type Subscriber struct {
	cfg    Config
	w      *kafkago.Writer
	intake bool // consumes the intake topics, not the lanes
	wg     sync.WaitGroup
	// life ends on Close; it bounds the background re-publishes.
	life context.Context

	mu      sync.Mutex
	closed  bool
	subs    []*subscription
	cancels []context.CancelFunc
	fwd     *forwarder
}

var _ broker.Subscriber = (*Subscriber)(nil)

// NewSubscriber creates missing topics and returns a Subscriber on the
// internal lane topics llmq.lane.<priority>.
func NewSubscriber(ctx context.Context, cfg Config) (*Subscriber, error) {
	return newSubscriber(ctx, cfg, false)
}

// NewIntakeSubscriber creates missing topics and returns a Subscriber on the
// intake topics llmq.jobs.<priority> and the Config.TenantTopics tenants'
// llmq.jobs.<priority>.<tenant>, merged into each priority's channel. Its deliveries settle as lane
// deliveries do, except Retry, which hands them back (see broker.Delivery);
// it runs no retry forwarder.
func NewIntakeSubscriber(ctx context.Context, cfg Config) (*Subscriber, error) {
	return newSubscriber(ctx, cfg, true)
}

func newSubscriber(ctx context.Context, cfg Config, intake bool) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := ensureTopics(ctx, cfg); err != nil {
		if intake {
			return nil, fmt.Errorf("kafka intake subscriber: %w", err)
		}
		return nil, fmt.Errorf("kafka subscriber: %w", err)
	}
	life, cancel := context.WithCancel(context.Background())
	return &Subscriber{cfg: cfg, w: newWriter(cfg), intake: intake, life: life,
		cancels: []context.CancelFunc{cancel}}, nil
}

// Subscribe consumes the priority's lane (or intake) topic with at most
// prefetch unsettled deliveries, processed concurrently even within one
// partition.
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
	if s.fwd == nil && !s.intake {
		fctx, cancel := context.WithCancel(context.Background())
		s.cancels = append(s.cancels, cancel)
		s.fwd = newForwarder(s)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.fwd.run(fctx)
		}()
	}
	sources := []intakeSource{{topic: s.cfg.laneTopic(lane), group: s.cfg.laneGroup(lane)}}
	if s.intake {
		sources = s.cfg.intakeSources(lane)
	}
	sctx, cancel := context.WithCancel(ctx)
	s.cancels = append(s.cancels, cancel)
	out := make(chan broker.Delivery)
	// One subscription per topic, each with its own prefetch: a shared
	// budget would let topics that wait for records hold slots that the
	// busy ones need.
	var feeding sync.WaitGroup
	for _, src := range sources {
		sub := &subscription{
			owner: s, lane: lane, topic: src.topic, tenant: src.tenant,
			gc:          newGroupConsumer(s.cfg, src.topic, src.group),
			slots:       make(chan struct{}, prefetch),
			outstanding: make(map[*delivery]struct{}),
		}
		s.subs = append(s.subs, sub)
		feeding.Add(1)
		s.wg.Go(func() {
			defer feeding.Done()
			sub.run(sctx, out)
		})
	}
	s.wg.Go(func() {
		feeding.Wait()
		close(out)
	})
	return out, nil
}

// Close stops every subscription, the forwarder and the background
// re-publishes, hands unsettled deliveries back (their offsets, and those of
// deliveries whose re-publish had not succeeded, stay uncommitted, so they
// are read again) and leaves the groups.
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
	topic string // the lane's or the intake's
	// tenant owns topic when it is a tenant's own intake topic; its
	// deliveries carry it as broker.Message.IntakeTenant.
	tenant string
	gc     *groupConsumer
	slots  chan struct{}

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
		msg.IntakeTenant = sub.tenant
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
