package rabbitmq

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Inspector measures depth by passive queue declares on a dedicated
// channel (exact, ~0.1 ms) and reads the dead-letter queue.
type Inspector struct {
	s  *session
	mu sync.Mutex
	ch *amqp.Channel
}

var (
	_ broker.Inspector        = (*Inspector)(nil)
	_ broker.DeadLetterReader = (*Inspector)(nil)
)

// NewInspector connects (declaring the topology) and returns an Inspector.
func NewInspector(ctx context.Context, cfg Config) (*Inspector, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := newSession(cfg, "inspector")
	if _, err := s.connection(ctx); err != nil {
		s.close()
		return nil, fmt.Errorf("rabbitmq inspector: %w", err)
	}
	return &Inspector{s: s}, nil
}

// Depth is the number of ready messages in the priority's intake and lane
// queues (unacked deliveries and delayed retries are not counted).
func (in *Inspector) Depth(ctx context.Context, lane job.Priority) (int64, error) {
	if !lane.Valid() {
		return 0, fmt.Errorf("rabbitmq: depth: unknown lane %q", lane)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	var total int64
	for _, q := range []string{in.s.names.intake(lane), in.s.names.lane(lane)} {
		n, err := in.ready(ctx, q)
		if err != nil {
			return 0, fmt.Errorf("rabbitmq: depth %s: %w", lane, err)
		}
		total += n
	}
	return total, nil
}

// ready is the queue's ready count, by a passive declare. Caller holds mu.
func (in *Inspector) ready(ctx context.Context, queue string) (int64, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if in.ch == nil || in.ch.IsClosed() {
			conn, err := in.s.connection(ctx)
			if err != nil {
				return 0, err
			}
			if in.ch, err = conn.Channel(); err != nil {
				lastErr = err
				continue
			}
		}
		q, err := in.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err == nil {
			return int64(q.Messages), nil
		}
		lastErr = err
	}
	return 0, fmt.Errorf("queue %s: %w", queue, lastErr)
}

// deadLetterIdle is how long ReadDeadLetters waits for more once it has one.
const deadLetterIdle = 100 * time.Millisecond

// DrainDeadLetters waits for the first dead letter, takes those that
// follow within a short idle window, at most max, and acks them once record
// returns nil; on an error they go back to the queue (nack with requeue),
// to be read again.
func (in *Inspector) DrainDeadLetters(ctx context.Context, max int, record func([]broker.DeadLetter) error) error {
	if max < 1 {
		max = 1
	}
	conn, err := in.s.connection(ctx)
	if err != nil {
		return fmt.Errorf("rabbitmq: read dead letters: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: read dead letters: open channel: %w", err)
	}
	defer ch.Close() // unacked extras go back to the queue
	if err := ch.Qos(max, 0, false); err != nil {
		return fmt.Errorf("rabbitmq: read dead letters: qos: %w", err)
	}
	msgs, err := ch.Consume(in.s.names.dead, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("rabbitmq: read dead letters: consume: %w", err)
	}
	var out []broker.DeadLetter
	var last amqp.Delivery
	idle := time.NewTimer(time.Hour)
	defer idle.Stop()
	for len(out) < max {
		var wait <-chan time.Time
		if len(out) > 0 {
			wait = idle.C
		}
		select {
		case m, ok := <-msgs:
			if !ok {
				return fmt.Errorf("rabbitmq: read dead letters: %w", broker.ErrClosed)
			}
			out = append(out, in.deadLetterOf(m))
			last = m
			idle.Reset(deadLetterIdle)
			continue
		case <-wait:
		case <-ctx.Done():
			if len(out) == 0 {
				return fmt.Errorf("rabbitmq: read dead letters: %w", ctx.Err())
			}
		}
		break
	}
	if err := record(out); err != nil {
		if nerr := last.Nack(true, true); nerr != nil {
			return fmt.Errorf("rabbitmq: read dead letters: %w (and the nack failed: the channel's close returns them: %v)", err, nerr)
		}
		return err
	}
	if err := last.Ack(true); err != nil {
		return fmt.Errorf("rabbitmq: read dead letters: ack: %w", err)
	}
	return nil
}

// ReadDeadLetters is DrainDeadLetters returning what it took.
func (in *Inspector) ReadDeadLetters(ctx context.Context, max int) ([]broker.DeadLetter, error) {
	return broker.ReadDeadLetters(ctx, max, in.DrainDeadLetters)
}

// deadLetterOf decodes an envelope, or wraps a message the broker
// dead-lettered by itself (x-delivery-limit) from an intake or a lane queue.
func (in *Inspector) deadLetterOf(m amqp.Delivery) broker.DeadLetter {
	queue, reason := lastDeath(m.Headers)
	// An envelope is one llmq published to the dead-letter exchange; a
	// message the broker dead-lettered (it names the queue it died in)
	// keeps its publisher's headers, the envelope mark included, which
	// vouch for nothing.
	if m.Headers[headerEnvelope] == "1" && queue == "" {
		var dl broker.DeadLetter
		if err := json.Unmarshal(m.Body, &dl); err == nil {
			return dl
		}
	}
	if reason == "" || reason == "delivery_limit" || reason == "rejected" {
		reason = broker.ReasonDeliveryLimit
	}
	// Both families end in the priority: llmq.jobs.<p>, llmq.lane.<p>.
	lane := job.Priority(queue[strings.LastIndex(queue, ".")+1:])
	fromIntake := lane.Valid() && queue == in.s.names.intake(lane)
	if !lane.Valid() {
		lane = job.Priority(m.RoutingKey)
	}
	return broker.DeadLetter{Body: m.Body, Key: m.MessageId, Reason: reason, Lane: lane,
		FromIntake: fromIntake, LastFailedAt: m.Timestamp, UserID: m.UserId}
}

// lastDeath is the queue and reason of the message's latest dead-lettering:
// the head of x-death (most recent first). x-first-death-* is the fallback,
// but it names the first one, which for a message that waited in a delay
// queue is that queue's expiry, not where it finally died.
func lastDeath(h amqp.Table) (queue, reason string) {
	if deaths, ok := h["x-death"].([]interface{}); ok && len(deaths) > 0 {
		if d, ok := deaths[0].(amqp.Table); ok {
			queue, _ = d["queue"].(string)
			reason, _ = d["reason"].(string)
			if queue != "" {
				return queue, reason
			}
		}
	}
	queue, _ = h["x-first-death-queue"].(string)
	reason, _ = h["x-first-death-reason"].(string)
	return queue, reason
}

// Close closes the connection.
func (in *Inspector) Close() error {
	in.s.close()
	return nil
}
