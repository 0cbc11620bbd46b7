// Package memory is an in-process broker driver for unit tests of the layers
// above the broker (worker, API, ingester). It keeps the broker contract —
// an intake list and a lane list per priority, prefetch, exactly-once
// settlement, redelivery, delayed retry on timers, a dead-letter list tests
// can read — without any I/O. Time is real time.AfterFunc timers, so tests
// of delayed retries run fast under testing/synctest.
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
	// MaxLength caps the ready messages of each lane and of each intake list;
	// a publish past it returns broker.ErrRejected (like RabbitMQ's
	// reject-publish). 0 = no cap.
	MaxLength int
}

// Broker holds the intake and lane lists, the dead-letter list and the
// status messages. Publishers, subscribers and inspectors are views on it
// with their own Close.
type Broker struct {
	cfg Config

	mu       sync.Mutex
	lanes    map[job.Priority]*queue
	intake   map[job.Priority]*queue
	dead     []broker.DeadLetter
	deadWake chan struct{}
	statuses [][]byte
	timers   map[*time.Timer]struct{}
	closed   bool
	// failRetry and failDead, when set, are what every Retry and DeadLetter
	// publish returns (FailRetries, FailDeadLetters).
	failRetry, failDead error

	results     []broker.ResultMessage
	replyQueues map[string]bool
	failResults error
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
		cfg:         cfg,
		lanes:       make(map[job.Priority]*queue),
		replyQueues: make(map[string]bool),
		intake:      make(map[job.Priority]*queue),
		deadWake:    make(chan struct{}),
		timers:      make(map[*time.Timer]struct{}),
	}
	for _, p := range job.Priorities {
		b.lanes[p] = &queue{wake: make(chan struct{})}
		b.intake[p] = &queue{wake: make(chan struct{})}
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

// Subscriber returns a new subscriber on b's lanes (the workers').
func (b *Broker) Subscriber() *Subscriber { return b.newSubscriber(false) }

// IntakeSubscriber returns a new subscriber on b's intake (the ingester's).
func (b *Broker) IntakeSubscriber() *Subscriber { return b.newSubscriber(true) }

func (b *Broker) newSubscriber(intake bool) *Subscriber {
	return &Subscriber{b: b, intake: intake, done: make(chan struct{}), outstanding: make(map[*delivery]struct{})}
}

// FailRetries makes the publish of every later Retry fail with err, as a
// broker refusing the retry would; nil makes them work again. For tests of
// the hand-back path.
func (b *Broker) FailRetries(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failRetry = err
}

// FailDeadLetters makes the publish of every later DeadLetter fail with
// err; nil makes them work again. For tests of the hand-back path.
func (b *Broker) FailDeadLetters(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failDead = err
}

// injected returns the error FailRetries (retry) or FailDeadLetters set.
func (b *Broker) injected(retry bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if retry {
		return b.failRetry
	}
	return b.failDead
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

// DrainDeadLetters waits for at least one dead letter, takes up to max of
// them and removes them once record returns nil; on an error they go back
// to the front of the list.
func (b *Broker) DrainDeadLetters(ctx context.Context, max int, record func([]broker.DeadLetter) error) error {
	for {
		b.mu.Lock()
		if len(b.dead) > 0 {
			n := min(max, len(b.dead))
			out := append([]broker.DeadLetter(nil), b.dead[:n]...)
			b.dead = append(b.dead[:0:0], b.dead[n:]...)
			b.mu.Unlock()
			if err := record(out); err != nil {
				b.mu.Lock()
				b.dead = append(out, b.dead...)
				b.mu.Unlock()
				return err
			}
			return nil
		}
		wake := b.deadWake
		b.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("read dead letters: %w", ctx.Err())
		}
	}
}

// ReadDeadLetters waits for at least one dead letter, then removes and
// returns up to max of them.
func (b *Broker) ReadDeadLetters(ctx context.Context, max int) ([]broker.DeadLetter, error) {
	return broker.ReadDeadLetters(ctx, max, b.DrainDeadLetters)
}

// queues is the intake or the lane family. Caller holds mu.
func (b *Broker) queues(intake bool) map[job.Priority]*queue {
	if intake {
		return b.intake
	}
	return b.lanes
}

// push appends (or, for a returned message, prepends) e to the intake or
// lane list of the priority.
func (b *Broker) push(intake bool, lane job.Priority, e entry, front bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return broker.ErrClosed
	}
	q, ok := b.queues(intake)[lane]
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

// pushLater delivers e on the lane after delay, holding no consumer.
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
			_ = b.push(false, lane, e, false)
		}
	})
	b.timers[tm] = struct{}{}
	return nil
}

// pop takes the head of the intake or lane list, or returns a channel
// closed when it grows.
func (b *Broker) pop(intake bool, lane job.Priority) (entry, bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queues(intake)[lane]
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
