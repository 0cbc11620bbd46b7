package rabbitmq

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/job"
)

// headerTier routes a delayed retry to its tier queue on the delay exchange.
// It must not start with "x-": a headers exchange ignores binding arguments
// with that prefix under x-match=all, so every tier would match every retry
// and each retry would come back once per tier. Its name predates the delay
// exchange; messages still in the old retry queues carry it too.
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
		{n.jobs, amqp.ExchangeDirect}, {n.lanes, amqp.ExchangeDirect}, {n.dlx, amqp.ExchangeFanout},
		{n.delay, amqp.ExchangeHeaders}, {n.status, amqp.ExchangeFanout}, {n.results, amqp.ExchangeTopic},
	}
	for _, e := range exchanges {
		if err := ch.ExchangeDeclare(e.name, e.kind, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", e.name, err)
		}
	}
	for _, lane := range job.Priorities {
		for _, qb := range []struct{ queue, exchange string }{
			{n.intake(lane), n.jobs}, {n.lane(lane), n.lanes},
		} {
			if err := declareJobQueue(ch, cfg, n, qb.queue); err != nil {
				return err
			}
			if err := ch.QueueBind(qb.queue, string(lane), qb.exchange, false, nil); err != nil {
				return fmt.Errorf("bind queue %s: %w", qb.queue, err)
			}
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
			"x-dead-letter-exchange": n.lanes, // no x-dead-letter-routing-key: keeps the priority key
			"x-dead-letter-strategy": "at-least-once",
			"x-overflow":             "reject-publish",
		}
		if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %s: %w", q, err)
		}
		bind := amqp.Table{"x-match": "all", headerTier: tierName(tier)}
		if err := ch.QueueBind(q, "", n.delay, false, bind); err != nil {
			return fmt.Errorf("bind queue %s: %w", q, err)
		}
	}
	return nil
}

// declareJobQueue declares an intake or lane queue: both families have the
// same arguments, which the broker checks on every redeclare.
func declareJobQueue(ch *amqp.Channel, cfg Config, n names, q string) error {
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
	if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		return fmt.Errorf("declare queue %s: %w", q, err)
	}
	return nil
}

// DeleteTopology deletes every exchange and queue under cfg.Prefix,
// messages included, and those of the retry exchange earlier versions
// declared; names that do not exist are skipped. For tests and teardown of
// scratch environments.
func DeleteTopology(ctx context.Context, cfg Config) error {
	cfg = cfg.WithDefaults()
	conn, err := amqp.Dial(cfg.URL)
	if err != nil {
		return fmt.Errorf("delete topology: dial: %w", err)
	}
	defer conn.Close()
	n := newNames(cfg.Prefix)
	queues := []string{n.dead}
	for _, lane := range job.Priorities {
		queues = append(queues, n.intake(lane), n.lane(lane))
	}
	for _, tier := range cfg.RetryTiers {
		queues = append(queues, n.tierQueue(tier), n.oldTierQueue(tier))
	}
	d := deleter{conn: conn}
	defer d.close()
	for _, q := range queues {
		if err := d.do(func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(q, false, false, false)
			return err
		}); err != nil {
			return fmt.Errorf("delete queue %s: %w", q, err)
		}
	}
	for _, e := range []string{n.jobs, n.lanes, n.dlx, n.delay, n.oldRetry, n.status, n.results} {
		if err := d.do(func(ch *amqp.Channel) error { return ch.ExchangeDelete(e, false, false) }); err != nil {
			return fmt.Errorf("delete exchange %s: %w", e, err)
		}
	}
	return nil
}

// deleter runs deletes on a channel, tolerating names that do not exist: a
// NOT_FOUND closes the channel, so the next delete opens another.
type deleter struct {
	conn *amqp.Connection
	ch   *amqp.Channel
}

func (d *deleter) do(op func(*amqp.Channel) error) error {
	if d.ch == nil || d.ch.IsClosed() {
		ch, err := d.conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		d.ch = ch
	}
	err := op(d.ch)
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return nil
	}
	return err
}

func (d *deleter) close() {
	if d.ch != nil {
		_ = d.ch.Close()
	}
}
