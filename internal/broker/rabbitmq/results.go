package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
)

var _ broker.ResultPublisher = (*Publisher)(nil)

// resultsInFlight bounds the result publishes awaiting their confirm at
// once: enough to keep both confirm channels busy (a confirm takes a round
// trip and an fsync), few enough that a batch cannot flood the broker.
const resultsInFlight = 128

// PublishResults publishes each event to the topic exchange llmq.results
// (routing key <tenant>.<status>, message-id = event id) and, when it has
// one, to its reply_to queue through the default exchange with its
// correlation-id, and returns once the broker confirmed them all. The
// exchange publish is not mandatory: with no queue bound, nobody
// subscribed, and that is not an error. The reply publish is mandatory, so
// a reply queue that is gone is reported rather than silently dropped.
func (p *Publisher) PublishResults(ctx context.Context, msgs []broker.ResultMessage) ([]int, error) {
	if p.closed.Load() {
		return nil, broker.ErrClosed
	}
	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		firstErr   error
		unroutable []int
		sem        = make(chan struct{}, resultsInFlight)
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	now := time.Now()
	for i, m := range msgs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			pub := amqp.Publishing{
				MessageId: m.EventID, Type: m.Type, ContentType: "application/json",
				DeliveryMode: amqp.Persistent, Timestamp: now, Body: m.Body,
				Headers: amqp.Table{"tenant": m.Tenant, "job_id": m.JobID},
			}
			if err := p.c.publish(ctx, p.s.names.results, m.RoutingKey, false, pub); err != nil {
				fail(fmt.Errorf("rabbitmq: publish result of job %s: %w", m.JobID, err))
				return
			}
			if m.ReplyTo == "" {
				return
			}
			pub.CorrelationId = m.CorrelationID
			err := p.c.publish(ctx, "", m.ReplyTo, true, pub)
			switch {
			case errors.Is(err, errUnroutable):
				mu.Lock()
				unroutable = append(unroutable, i)
				mu.Unlock()
			case err != nil:
				fail(fmt.Errorf("rabbitmq: publish result of job %s to its reply queue: %w", m.JobID, err))
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return unroutable, nil
}
