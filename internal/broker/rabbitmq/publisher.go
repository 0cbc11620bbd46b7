package rabbitmq

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Publisher publishes jobs and status documents.
type Publisher struct {
	s      *session
	c      *confirmer
	closed atomic.Bool
	routes routes // of result events (results.go)
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

// Publish sends msg to the internal exchange llmq.lanes with routing key
// lane and returns once the broker confirmed it.
func (p *Publisher) Publish(ctx context.Context, lane job.Priority, msg broker.Message) error {
	return p.publish(ctx, p.s.names.lanes, "lane", lane, msg)
}

// PublishIntake sends msg to the public intake exchange llmq.jobs with
// routing key lane, as producers do, and returns once the broker confirmed
// it.
func (p *Publisher) PublishIntake(ctx context.Context, lane job.Priority, msg broker.Message) error {
	return p.publish(ctx, p.s.names.jobs, "intake", lane, msg)
}

func (p *Publisher) publish(ctx context.Context, exchange, family string, lane job.Priority, msg broker.Message) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	if !lane.Valid() {
		return fmt.Errorf("rabbitmq: publish %s: unknown lane %q", msg.Key, lane)
	}
	if err := p.c.publish(ctx, exchange, string(lane), true, publishing(msg, nil)); err != nil {
		return fmt.Errorf("rabbitmq: publish %s to %s %s: %w", msg.Key, family, lane, err)
	}
	return nil
}

// PublishStatus broadcasts body on the llmq.status fanout exchange.
func (p *Publisher) PublishStatus(ctx context.Context, body []byte) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	pub := amqp.Publishing{ContentType: "application/json", Body: body, Timestamp: time.Now()}
	// Not mandatory: no queue need be bound to the status exchange.
	if err := p.c.publish(ctx, p.s.names.status, "", false, pub); err != nil {
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
// (driver) headers are added after the message's own. UserID is never
// copied: RabbitMQ refuses a user_id other than the connection's own, and
// an identity is judged once, at intake.
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
		MessageId:     msg.Key,
		DeliveryMode:  amqp.Persistent,
		ReplyTo:       msg.ReplyTo,
		CorrelationId: msg.CorrelationID,
		Headers:       headers,
		Body:          msg.Body,
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
