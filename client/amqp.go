package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQPPublisher publishes jobs to llmq's RabbitMQ intake: exchange
// llmq.jobs, routing key = the job's priority, a persistent message whose
// MessageId is the job ID, whose ReplyTo and CorrelationId are the job's,
// whose UserId is the URL's user (NewAMQPPublisher),
// and whose body is the job's JSON. Each publish is
// mandatory and waits for its publisher confirm, so a nil error means a
// queue of llmq holds the job; concurrent publishes are pipelined on one
// channel, each waiting only for its own confirm.
type AMQPPublisher struct {
	url string // "" for a publisher on a caller's channel, never reopened
	// userID is the URL's user, sent as user_id: RabbitMQ checks it against
	// the connection's user, and llmq takes the job's tenant from it where
	// tenants.<t>.broker_users maps it (docs/design.md#broker-identity).
	userID string
	seq    atomic.Uint64

	mu     sync.Mutex // guards what follows
	conn   *amqp.Connection
	cc     *confirmChannel
	closed bool
}

// NewAMQPPublisher connects to RabbitMQ at url (amqp://user:pass@host:5672/vhost).
// It owns the connection: when the connection or its channel is lost, the
// publishes then in flight fail (retryably) and the next one reconnects.
func NewAMQPPublisher(url string) (*AMQPPublisher, error) {
	p := &AMQPPublisher{url: url}
	if uri, err := amqp.ParseURI(url); err == nil {
		p.userID = uri.Username
	}
	if _, err := p.channel(); err != nil {
		return nil, fmt.Errorf("llmq: amqp publisher: %w", err)
	}
	return p, nil
}

// NewAMQPPublisherOnChannel publishes on a channel the caller opened. It
// puts ch in confirm mode and listens for its returns; ch may carry the
// caller's other publishes too. Close leaves ch open; once ch closes, every
// publish fails with ErrClosed.
func NewAMQPPublisherOnChannel(ch *amqp.Channel) (*AMQPPublisher, error) {
	cc, err := newConfirmChannel(ch)
	if err != nil {
		return nil, fmt.Errorf("llmq: amqp publisher: %w", err)
	}
	return &AMQPPublisher{cc: cc}, nil
}

// Publish validates j and publishes it, returning once RabbitMQ confirmed
// it. A job that no llmq queue takes is ErrUnroutable; one RabbitMQ
// refuses (an intake at its length limit) is ErrRejected.
func (p *AMQPPublisher) Publish(ctx context.Context, j Job) error {
	body, err := prepare(&j)
	if err != nil {
		return fmt.Errorf("llmq: publish: %w", err)
	}
	lane := string(j.lane())
	fail := func(err error) error {
		return &PublishError{JobID: j.ID, To: "exchange " + IntakeExchange + ", routing key " + lane, Err: err}
	}
	cc, err := p.channel()
	if err != nil {
		return fail(err)
	}
	headers := amqp.Table{headerPublishID: strconv.FormatUint(p.seq.Add(1), 36)}
	if j.Tenant != "" {
		headers["tenant"] = j.Tenant
	}
	// reply_to and correlation_id also go in the AMQP properties, where an
	// AMQP reader looks for them; llmq reads either, and they agree.
	msg := amqp.Publishing{
		MessageId: j.ID, DeliveryMode: amqp.Persistent, ContentType: "application/json",
		ReplyTo: j.ReplyTo, CorrelationId: j.CorrelationID, UserId: p.userID,
		Timestamp: time.Now(), Headers: headers, Body: body,
	}
	if err := cc.publish(ctx, lane, msg); err != nil {
		return fail(err)
	}
	return nil
}

// Close closes the connection the publisher opened (not a caller's
// channel). Publishes in flight fail; their jobs may or may not be queued.
func (p *AMQPPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.conn == nil {
		return nil
	}
	if err := p.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("llmq: close amqp publisher: %w", err)
	}
	return nil
}

// channel returns the live confirm channel, reconnecting an owned one.
func (p *AMQPPublisher) channel() (*confirmChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return nil, ErrClosed
	case p.cc != nil && !p.cc.ch.IsClosed():
		return p.cc, nil
	case p.url == "":
		return nil, fmt.Errorf("%w: the channel was closed (%v)", ErrClosed, p.cc.closeReason())
	}
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := amqp.Dial(p.url)
		if err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
		p.conn = conn
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	cc, err := newConfirmChannel(ch)
	if err != nil {
		_ = ch.Close()
		return nil, err
	}
	p.cc = cc
	return cc, nil
}
