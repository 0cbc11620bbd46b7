// Package memory is an in-process broker driver for unit tests of the layers
// above the broker (worker, API). It keeps the broker contract — prefetch,
// exactly-once settlement, redelivery, delayed retry on timers, a
// dead-letter list tests can read — without any I/O. Time is real
// time.AfterFunc timers, so tests of delayed retries run fast under
// testing/synctest.
package memory

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Config tunes the in-memory broker. The zero value is ready to use.
type Config struct {
	// MaxLength caps the ready messages of each lane; a publish past it
	// returns broker.ErrRejected (like RabbitMQ's reject-publish). 0 = no cap.
	MaxLength int
}

// Broker holds the lanes, the dead-letter list and the status messages.
// Publishers, subscribers and inspectors are views on it with their own Close.
type Broker struct {
	cfg Config

	mu       sync.Mutex
	lanes    map[job.Priority]*queue
	dead     []broker.DeadLetter
	deadWake chan struct{}
	statuses [][]byte
	timers   map[*time.Timer]struct{}
	closed   bool
}

type queue struct {
	ready []entry
	wake  chan struct{} // closed and replaced whenever ready grows
}

type entry struct {
	msg         broker.Message
	redelivered bool
}

// New returns an empty broker.
func New(cfg Config) *Broker {
	b := &Broker{
		cfg:      cfg,
		lanes:    make(map[job.Priority]*queue),
		deadWake: make(chan struct{}),
		timers:   make(map[*time.Timer]struct{}),
	}
	for _, p := range job.Priorities {
		b.lanes[p] = &queue{wake: make(chan struct{})}
	}
	return b
}

// Close stops pending delayed retries (their messages are dropped: this is
// memory) and makes every later publish return broker.ErrClosed.
func (b *Broker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for tm := range b.timers {
		tm.Stop()
	}
	clear(b.timers)
	return nil
}

// Publisher returns a new publisher on b.
func (b *Broker) Publisher() *Publisher { return &Publisher{b: b} }

// Subscriber returns a new subscriber on b.
func (b *Broker) Subscriber() *Subscriber {
	return &Subscriber{b: b, done: make(chan struct{}), outstanding: make(map[*delivery]struct{})}
}

// Inspector returns a new inspector on b.
func (b *Broker) Inspector() *Inspector { return &Inspector{b: b} }

// DeadLetters returns a snapshot of the dead-letter list.
func (b *Broker) DeadLetters() []broker.DeadLetter {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]broker.DeadLetter(nil), b.dead...)
}

// Statuses returns the status documents published so far.
func (b *Broker) Statuses() [][]byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([][]byte(nil), b.statuses...)
}

// ReadDeadLetters waits for at least one dead letter, then removes and
// returns up to max of them.
func (b *Broker) ReadDeadLetters(ctx context.Context, max int) ([]broker.DeadLetter, error) {
	for {
		b.mu.Lock()
		if len(b.dead) > 0 {
			n := min(max, len(b.dead))
			out := append([]broker.DeadLetter(nil), b.dead[:n]...)
			b.dead = append(b.dead[:0:0], b.dead[n:]...)
			b.mu.Unlock()
			return out, nil
		}
		wake := b.deadWake
		b.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, fmt.Errorf("read dead letters: %w", ctx.Err())
		}
	}
}

// push appends (or, for a returned message, prepends) e to the lane.
func (b *Broker) push(lane job.Priority, e entry, front bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return broker.ErrClosed
	}
	q, ok := b.lanes[lane]
	if !ok {
		return fmt.Errorf("memory: unknown lane %q", lane)
	}
	if !front && b.cfg.MaxLength > 0 && len(q.ready) >= b.cfg.MaxLength {
		return broker.ErrRejected
	}
	e.msg = cloneMessage(e.msg)
	if front {
		q.ready = append([]entry{e}, q.ready...)
	} else {
		q.ready = append(q.ready, e)
	}
	close(q.wake)
	q.wake = make(chan struct{})
	return nil
}

// pushLater delivers e on lane after delay, holding no consumer.
func (b *Broker) pushLater(lane job.Priority, e entry, delay time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return broker.ErrClosed
	}
	var tm *time.Timer
	tm = time.AfterFunc(delay, func() {
		b.mu.Lock()
		_, live := b.timers[tm]
		delete(b.timers, tm)
		b.mu.Unlock()
		if live {
			_ = b.push(lane, e, false)
		}
	})
	b.timers[tm] = struct{}{}
	return nil
}

// pop takes the head of the lane, or returns a channel closed when it grows.
func (b *Broker) pop(lane job.Priority) (entry, bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.lanes[lane]
	if len(q.ready) == 0 {
		return entry{}, false, q.wake
	}
	e := q.ready[0]
	q.ready[0] = entry{}
	q.ready = q.ready[1:]
	return e, true, nil
}

func (b *Broker) addDead(dl broker.DeadLetter) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return broker.ErrClosed
	}
	dl.Body = append([]byte(nil), dl.Body...)
	b.dead = append(b.dead, dl)
	close(b.deadWake)
	b.deadWake = make(chan struct{})
	return nil
}

func cloneMessage(m broker.Message) broker.Message {
	m.Body = append([]byte(nil), m.Body...)
	if m.Headers != nil {
		m.Headers = broker.MergeHeaders(m.Headers, nil)
	}
	return m
}

// Publisher publishes to a Broker.
type Publisher struct {
	b      *Broker
	mu     sync.Mutex
	closed bool
}

var _ broker.Publisher = (*Publisher)(nil)

// Publish appends msg to the lane.
func (p *Publisher) Publish(ctx context.Context, lane job.Priority, msg broker.Message) error {
	if p.isClosed() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish %s: %w", msg.Key, err)
	}
	return p.b.push(lane, entry{msg: msg}, false)
}

// PublishStatus records body; Broker.Statuses returns it.
func (p *Publisher) PublishStatus(ctx context.Context, body []byte) error {
	if p.isClosed() {
		return broker.ErrClosed
	}
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	p.b.statuses = append(p.b.statuses, append([]byte(nil), body...))
	return nil
}

// Close makes later publishes return broker.ErrClosed.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

func (p *Publisher) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Inspector reports lane depth.
type Inspector struct{ b *Broker }

var _ broker.Inspector = (*Inspector)(nil)

// Depth is the number of ready messages on the lane (not in flight, not
// waiting for a delayed retry).
func (i *Inspector) Depth(ctx context.Context, lane job.Priority) (int64, error) {
	i.b.mu.Lock()
	defer i.b.mu.Unlock()
	q, ok := i.b.lanes[lane]
	if !ok {
		return 0, fmt.Errorf("memory: unknown lane %q", lane)
	}
	return int64(len(q.ready)), nil
}

// Close does nothing.
func (i *Inspector) Close() error { return nil }
