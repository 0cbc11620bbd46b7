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

var (
	_ broker.ResultPublisher = (*Publisher)(nil)
	_ broker.ResultAudience  = (*Publisher)(nil)
)

// Unheard reports whether an event with routingKey would be skipped now:
// no queue was bound to it when it was last probed, less than unboundFor
// ago (see routes).
func (p *Publisher) Unheard(routingKey string) bool {
	return p.routes.unheard(routingKey, time.Now())
}

// resultsInFlight bounds the result publishes awaiting their confirm at
// once: enough to keep both confirm channels busy (a confirm takes a round
// trip and an fsync), few enough that a batch cannot flood the broker.
const resultsInFlight = 128

// unboundFor is how long a routing key that no queue is bound to goes
// unpublished after the broker said so; see routes.
const unboundFor = time.Second

// routes remembers which routing keys of llmq.results reach no queue. The
// broker drops an event no binding matches; skipping it saves both sides
// the publish (in the pipeline benchmark, where nobody subscribes, a
// fifth of the throughput). Once per unboundFor a key's event goes out
// mandatory, as a probe: returned, the key is unbound for the next
// unboundFor; so a queue bound to llmq.results receives every event
// published from at most a second after its binding.
type routes struct {
	mu      sync.Mutex
	probed  map[string]time.Time // last mandatory publish per key
	unbound map[string]time.Time // key -> until when it is skipped
}

// plan says whether to publish an event with key now and whether as a probe.
func (r *routes) plan(key string, now time.Time) (publish, probe bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.probed == nil {
		r.probed, r.unbound = map[string]time.Time{}, map[string]time.Time{}
	}
	if now.Before(r.unbound[key]) {
		return false, false
	}
	if now.Sub(r.probed[key]) >= unboundFor {
		r.probed[key] = now
		return true, true
	}
	return true, false
}

// unheard reports whether key's events are being skipped at now.
func (r *routes) unheard(key string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return now.Before(r.unbound[key])
}

func (r *routes) markUnbound(key string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unbound[key] = now.Add(unboundFor)
}

// PublishResults publishes each event to the topic exchange llmq.results
// (routing key <tenant>.<status>, message-id = event id) and, when it has
// one, to its reply_to queue through the default exchange with its
// correlation-id, and returns once the broker confirmed them all. An event
// whose routing key no queue is bound to is not an error (nobody
// subscribed; see routes). The reply publish is mandatory, so a reply
// queue that is gone is reported rather than silently dropped. A message
// the broker nacks (a reply queue full with reject-publish) is reported
// in a *broker.ResultsRefused; the others are published.
func (p *Publisher) PublishResults(ctx context.Context, msgs []broker.ResultMessage) ([]int, error) {
	if p.closed.Load() {
		return nil, broker.ErrClosed
	}
	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		firstErr   error
		unroutable []int
		refused    = map[int]error{}
		sem        = make(chan struct{}, resultsInFlight)
	)
	fail := func(i int, err error) {
		mu.Lock()
		defer mu.Unlock()
		if errors.Is(err, broker.ErrRejected) {
			// Nacked: this message's queue refused it (a full reply queue
			// with reject-publish), not the broker the batch.
			refused[i] = err
			return
		}
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
			if publish, probe := p.routes.plan(m.RoutingKey, now); publish {
				err := p.c.publish(ctx, p.s.names.results, m.RoutingKey, probe, pub)
				switch {
				case probe && errors.Is(err, errUnroutable):
					p.routes.markUnbound(m.RoutingKey, now)
				case err != nil:
					fail(i, fmt.Errorf("rabbitmq: publish result of job %s: %w", m.JobID, err))
					return
				}
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
				fail(i, fmt.Errorf("rabbitmq: publish result of job %s to its reply queue: %w", m.JobID, err))
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if len(refused) > 0 {
		return unroutable, &broker.ResultsRefused{Refused: refused}
	}
	return unroutable, nil
}
