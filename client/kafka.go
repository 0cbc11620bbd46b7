package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
)

// KafkaPublisher publishes jobs to llmq's Kafka intake: topic
// llmq.jobs.<priority>, message key = job ID (so a job's copies share a
// partition), value = the job's JSON. A publish returns once every in-sync
// replica has the message (acks=all); publishes in flight at once are
// batched together, and a lone one is held at most 5ms. The topics are
// llmq's: it creates them when it starts, and the publisher never does.
type KafkaPublisher struct {
	w      *kafka.Writer
	closed atomic.Bool
}

// KafkaOption configures a KafkaPublisher's connections.
type KafkaOption func(*kafka.Transport)

// WithKafkaTLS encrypts the connections with c (and its client
// certificate, if it has one).
func WithKafkaTLS(c *tls.Config) KafkaOption { return func(t *kafka.Transport) { t.TLS = c } }

// WithKafkaSASL authenticates the connections with m (kafka-go's
// sasl/plain or sasl/scram mechanisms).
func WithKafkaSASL(m sasl.Mechanism) KafkaOption { return func(t *kafka.Transport) { t.SASL = m } }

// NewKafkaPublisher returns a publisher to the cluster of brokers
// (host:port seeds). It connects on the first publish.
func NewKafkaPublisher(brokers []string, opts ...KafkaOption) (*KafkaPublisher, error) {
	if len(brokers) == 0 {
		return nil, errors.New("llmq: kafka publisher: no brokers")
	}
	tr := &kafka.Transport{}
	for _, o := range opts {
		o(tr)
	}
	return &KafkaPublisher{w: &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Balancer:     &kafka.Hash{},
		BatchTimeout: 5 * time.Millisecond,
		RequiredAcks: kafka.RequireAll,
		Transport:    tr,
	}}, nil
}

// Publish validates j and writes it to its topic, returning once the
// cluster acknowledged it.
func (p *KafkaPublisher) Publish(ctx context.Context, j Job) error {
	body, err := prepare(&j)
	if err != nil {
		return fmt.Errorf("llmq: publish: %w", err)
	}
	topic := IntakeTopicPrefix + string(j.lane())
	fail := func(err error) error { return &PublishError{JobID: j.ID, To: "topic " + topic, Err: err} }
	if p.closed.Load() {
		return fail(ErrClosed)
	}
	msg := kafka.Message{Topic: topic, Key: []byte(j.ID), Value: body}
	if j.Tenant != "" {
		msg.Headers = []kafka.Header{{Key: "tenant", Value: []byte(j.Tenant)}}
	}
	if err := p.w.WriteMessages(ctx, msg); err != nil {
		if errors.Is(err, io.ErrClosedPipe) {
			err = ErrClosed
		}
		return fail(err)
	}
	return nil
}

// Close waits for the writes in flight and closes the publisher's
// connections.
func (p *KafkaPublisher) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	err := p.w.Close()
	p.w.Transport.(*kafka.Transport).CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("llmq: close kafka publisher: %w", err)
	}
	return nil
}
