package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// newWriter returns a writer that acks with all in-sync replicas and lingers
// only BatchTimeout, so concurrent publishes batch but a lone one is not held.
func newWriter(cfg Config) *kafkago.Writer {
	return &kafkago.Writer{
		Addr:         kafkago.TCP(cfg.Brokers...),
		Balancer:     &kafkago.Hash{},
		BatchTimeout: cfg.BatchTimeout,
		BatchSize:    1000,
		RequiredAcks: kafkago.RequireAll,
		MaxAttempts:  5,
		Transport:    newTransport(cfg),
	}
}

// Publisher writes jobs to lane and intake topics and status documents to
// llmq.status.
type Publisher struct {
	cfg     Config
	w       *kafkago.Writer
	closed  atomic.Bool
	results resultTopics
	split   splitWriter
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher creates missing topics and returns a Publisher.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := ensureTopics(ctx, cfg); err != nil {
		return nil, fmt.Errorf("kafka publisher: %w", err)
	}
	w := newWriter(cfg)
	return &Publisher{cfg: cfg, w: w, split: newSplitWriter(w)}, nil
}

// Publish writes msg to the internal lane topic llmq.lane.<lane> (key = job
// ID) and returns once all in-sync replicas have it.
func (p *Publisher) Publish(ctx context.Context, lane job.Priority, msg broker.Message) error {
	return p.publish(ctx, p.cfg.laneTopic, "lane", lane, msg)
}

// VouchesIntakeTenant: a message published with IntakeTenant reaches the
// ingester from the tenant's own topic, as the tenant's (PublishIntake).
func (p *Publisher) VouchesIntakeTenant() bool { return true }

// PublishIntake writes msg to the intake topic llmq.jobs.<lane> (key = job
// ID), as producers do, and returns once all in-sync replicas have it. A
// msg with IntakeTenant goes to that tenant's own topic
// llmq.jobs.<lane>.<tenant> instead, which only its principals may write.
func (p *Publisher) PublishIntake(ctx context.Context, lane job.Priority, msg broker.Message) error {
	if t := msg.IntakeTenant; t != "" {
		return p.publish(ctx, func(l job.Priority) string { return p.cfg.tenantTopic(l, t) }, "intake of tenant "+t, lane, msg)
	}
	return p.publish(ctx, p.cfg.intakeTopic, "intake", lane, msg)
}

func (p *Publisher) publish(ctx context.Context, topic func(job.Priority) string, family string, lane job.Priority, msg broker.Message) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	if !lane.Valid() {
		return fmt.Errorf("kafka: publish %s: unknown lane %q", msg.Key, lane)
	}
	if err := write(ctx, p.w, record(topic(lane), msg, nil)); err != nil {
		return fmt.Errorf("kafka: publish %s to %s %s: %w", msg.Key, family, lane, err)
	}
	return nil
}

// PublishStatus writes body to the status topic.
func (p *Publisher) PublishStatus(ctx context.Context, body []byte) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	if err := write(ctx, p.w, kafkago.Message{Topic: p.cfg.statusTopic(), Value: body}); err != nil {
		return fmt.Errorf("kafka: publish status: %w", err)
	}
	return nil
}

// Close flushes and closes the writer.
func (p *Publisher) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	serr := p.split.w.Close() // its transport is p.w's
	if err := closeWriter(p.w); err != nil {
		return fmt.Errorf("kafka: close publisher: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("kafka: close publisher: %w", serr)
	}
	return nil
}

// closeWriter flushes w and closes its connections.
func closeWriter(w *kafkago.Writer) error {
	err := w.Close()
	if tr, ok := w.Transport.(*kafkago.Transport); ok {
		tr.CloseIdleConnections()
	}
	return err
}

func write(ctx context.Context, w *kafkago.Writer, msgs ...kafkago.Message) error {
	err := w.WriteMessages(ctx, msgs...)
	if errors.Is(err, io.ErrClosedPipe) {
		return broker.ErrClosed
	}
	return err
}

// record builds a Kafka message; extra (driver) headers follow msg's own.
func record(topic string, msg broker.Message, extra map[string]string) kafkago.Message {
	m := kafkago.Message{Topic: topic, Key: []byte(msg.Key), Value: msg.Body}
	for k, v := range msg.Headers {
		m.Headers = append(m.Headers, kafkago.Header{Key: k, Value: []byte(v)})
	}
	for k, v := range extra {
		m.Headers = append(m.Headers, kafkago.Header{Key: k, Value: []byte(v)})
	}
	return m
}

// messageOf is the broker.Message of a record, without x-llmq-* headers.
func messageOf(m kafkago.Message) (broker.Message, map[string]string) {
	msg := broker.Message{Key: string(m.Key), Body: m.Value}
	internal := map[string]string{}
	for _, h := range m.Headers {
		if len(h.Key) > 7 && h.Key[:7] == "x-llmq-" {
			internal[h.Key] = string(h.Value)
			continue
		}
		if msg.Headers == nil {
			msg.Headers = make(map[string]string)
		}
		msg.Headers[h.Key] = string(h.Value)
	}
	return msg, internal
}
