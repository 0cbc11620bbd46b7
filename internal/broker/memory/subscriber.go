package memory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Subscriber consumes the lanes or the intake of a Broker. Its goroutines
// stop on Close or when their Subscribe ctx ends.
type Subscriber struct {
	b      *Broker
	intake bool // consumes the intake lists, not the lanes
	wg     sync.WaitGroup
	done   chan struct{}

	mu          sync.Mutex
	closed      bool
	outstanding map[*delivery]struct{}
}

var _ broker.Subscriber = (*Subscriber)(nil)

// Subscribe delivers the messages of the priority's lane (or intake), at
// most prefetch unsettled at once.
func (s *Subscriber) Subscribe(ctx context.Context, lane job.Priority, prefetch int) (<-chan broker.Delivery, error) {
	if !lane.Valid() {
		return nil, fmt.Errorf("memory: subscribe: unknown lane %q", lane)
	}
	if prefetch < 1 {
		prefetch = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, broker.ErrClosed
	}
	out := make(chan broker.Delivery)
	slots := make(chan struct{}, prefetch)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		s.run(ctx, lane, slots, out)
	}()
	return out, nil
}

func (s *Subscriber) run(ctx context.Context, lane job.Priority, slots chan struct{}, out chan<- broker.Delivery) {
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		case <-s.done:
			return
		}
		var e entry
		for {
			var ok bool
			var wake <-chan struct{}
			e, ok, wake = s.b.pop(s.intake, lane)
			if ok {
				break
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			case <-s.done:
				return
			}
		}
		d := &delivery{sub: s, lane: lane, e: e, release: func() { <-slots }}
		s.mu.Lock()
		s.outstanding[d] = struct{}{}
		s.mu.Unlock()
		select {
		case out <- d:
		case <-ctx.Done():
			d.handBack()
			return
		case <-s.done:
			d.handBack()
			return
		}
	}
}

// Close stops every subscription and hands unsettled deliveries back.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	pending := make([]*delivery, 0, len(s.outstanding))
	for d := range s.outstanding {
		pending = append(pending, d)
	}
	s.mu.Unlock()
	for _, d := range pending {
		d.handBack()
	}
	return nil
}

func (s *Subscriber) forget(d *delivery) {
	s.mu.Lock()
	delete(s.outstanding, d)
	s.mu.Unlock()
}

type deliveryState int

const (
	pending deliveryState = iota
	settled
	returned
)

type delivery struct {
	sub     *Subscriber
	lane    job.Priority
	e       entry
	release func()

	mu    sync.Mutex
	state deliveryState
}

var _ broker.Delivery = (*delivery)(nil)

func (d *delivery) Message() broker.Message { return d.e.msg }
func (d *delivery) Lane() job.Priority      { return d.lane }
func (d *delivery) Redelivered() bool       { return d.e.redelivered }

// settle runs publish (if any) and settles d exactly once. When publish
// fails, d is handed back to the head of its list instead, and the error
// wraps broker.ErrHandedBack.
func (d *delivery) settle(op string, publish func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch d.state {
	case settled:
		return broker.ErrSettled
	case returned:
		return fmt.Errorf("memory: delivery %s was handed back: %w", d.e.msg.Key, broker.ErrClosed)
	}
	var err error
	if publish != nil {
		err = publish()
	}
	d.state = settled
	d.sub.forget(d)
	d.release()
	if err != nil {
		// A closed broker takes nothing back: this is memory.
		_ = d.pushBack()
		return fmt.Errorf("memory: %s %s: %w: %w", op, d.e.msg.Key, broker.ErrHandedBack, err)
	}
	return nil
}

// handBack returns an unsettled delivery to the head of its list.
func (d *delivery) handBack() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != pending {
		return
	}
	d.state = returned
	d.sub.forget(d)
	d.release()
	d.pushBack()
}

// pushBack puts the message back at the head of its list, for redelivery.
func (d *delivery) pushBack() error {
	return d.sub.b.push(d.sub.intake, d.lane, entry{msg: d.e.msg, redelivered: true}, true)
}

func (d *delivery) Ack(ctx context.Context) error {
	return d.settle("ack", nil)
}

func (d *delivery) Nack(ctx context.Context) error {
	return d.settle("nack", d.pushBack)
}

func (d *delivery) Retry(ctx context.Context, delay time.Duration, headers map[string]string) error {
	if d.sub.intake {
		return d.settle("retry", func() error { return errRetryOnIntake })
	}
	return d.settle("retry", func() error {
		if err := d.sub.b.injected(true); err != nil {
			return err
		}
		m := d.e.msg
		m.Headers = broker.MergeHeaders(m.Headers, headers)
		if delay <= 0 {
			return d.sub.b.push(false, d.lane, entry{msg: m}, false)
		}
		return d.sub.b.pushLater(d.lane, entry{msg: m}, delay)
	})
}

// errRetryOnIntake is why Retry hands an intake delivery back.
var errRetryOnIntake = errors.New("retry is not supported on the intake")

func (d *delivery) DeadLetter(ctx context.Context, dl broker.DeadLetter) error {
	dl = dl.Filled(d.e.msg, d.lane, d.sub.intake)
	return d.settle("dead-letter", func() error {
		if err := d.sub.b.injected(false); err != nil {
			return err
		}
		return d.sub.b.addDead(dl)
	})
}
