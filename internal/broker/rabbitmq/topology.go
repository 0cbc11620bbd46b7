package rabbitmq

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/job"
)

// headerTier routes a delayed retry to its tier queue on the retry exchange.
// It must not start with "x-": a headers exchange ignores binding arguments
// with that prefix under x-match=all, so every tier would match every retry
// and each retry would come back once per tier.
const headerTier = "llmq-retry-tier"

// headerEnvelope marks a dead-letter queue message whose body is a
// broker.DeadLetter envelope (not one the broker dead-lettered by itself).
const headerEnvelope = "x-llmq-envelope"

// declareTopology declares every exchange, queue and binding; idempotent.
func declareTopology(conn *amqp.Connection, cfg Config, n names) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("declare topology: open channel: %w", err)
	}
	defer ch.Close()
	exchanges := []struct{ name, kind string }{
		{n.jobs, amqp.ExchangeDirect}, {n.dlx, amqp.ExchangeFanout},
		{n.retry, amqp.ExchangeHeaders}, {n.status, amqp.ExchangeFanout},
	}
	for _, e := range exchanges {
		if err := ch.ExchangeDeclare(e.name, e.kind, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", e.name, err)
		}
	}
	for _, lane := range job.Priorities {
		args := amqp.Table{
			"x-queue-type":           "quorum",
			"x-delivery-limit":       int64(cfg.DeliveryLimit),
			"x-dead-letter-exchange": n.dlx,
			"x-dead-letter-strategy": "at-least-once",
			"x-overflow":             "reject-publish",
		}
		if cfg.MaxLength > 0 {
			args["x-max-length"] = int64(cfg.MaxLength)
		}
		q := n.lane(lane)
		if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %s: %w", q, err)
		}
		if err := ch.QueueBind(q, string(lane), n.jobs, false, nil); err != nil {
			return fmt.Errorf("bind queue %s: %w", q, err)
		}
	}
	if _, err := ch.QueueDeclare(n.dead, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return fmt.Errorf("declare queue %s: %w", n.dead, err)
	}
	if err := ch.QueueBind(n.dead, "", n.dlx, false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", n.dead, err)
	}
	for _, tier := range cfg.RetryTiers {
		q := n.tierQueue(tier)
		args := amqp.Table{
			"x-queue-type":           "quorum",
			"x-message-ttl":          tier.Milliseconds(),
			"x-dead-letter-exchange": n.jobs, // no x-dead-letter-routing-key: keeps the lane key
			"x-dead-letter-strategy": "at-least-once",
			"x-overflow":             "reject-publish",
		}
		if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %s: %w", q, err)
		}
		bind := amqp.Table{"x-match": "all", headerTier: tierName(tier)}
		if err := ch.QueueBind(q, "", n.retry, false, bind); err != nil {
			return fmt.Errorf("bind queue %s: %w", q, err)
		}
	}
	return nil
}

// DeleteTopology deletes every exchange and queue under cfg.Prefix,
// messages included. For tests and teardown of scratch environments.
func DeleteTopology(ctx context.Context, cfg Config) error {
	cfg = cfg.WithDefaults()
	conn, err := amqp.Dial(cfg.URL)
	if err != nil {
		return fmt.Errorf("delete topology: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("delete topology: open channel: %w", err)
	}
	defer ch.Close()
	n := newNames(cfg.Prefix)
	queues := []string{n.dead}
	for _, lane := range job.Priorities {
		queues = append(queues, n.lane(lane))
	}
	for _, tier := range cfg.RetryTiers {
		queues = append(queues, n.tierQueue(tier))
	}
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("delete queue %s: %w", q, err)
		}
	}
	for _, e := range []string{n.jobs, n.dlx, n.retry, n.status} {
		if err := ch.ExchangeDelete(e, false, false); err != nil {
			return fmt.Errorf("delete exchange %s: %w", e, err)
		}
	}
	return nil
}
