package rabbitmq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/job"
)

// rawChannel is a plain AMQP channel on the test broker, closed at cleanup.
func rawChannel(t *testing.T, cfg rabbitmq.Config) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// Publishes of jobs are mandatory: one that reaches no queue (deleted
// under the driver) is an error, and a retry that cannot be held is handed
// back, where a plain publish would have been confirmed and lost.
func TestUnroutablePublishFails(t *testing.T) {
	cfg := testConfig(t)
	p := newPublisher(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Publish(ctx, job.PriorityNormal, broker.Message{Key: "a"}); err != nil {
		t.Fatal(err)
	}
	ch, err := newSubscriber(t, cfg).Subscribe(ctx, job.PriorityNormal, 1)
	if err != nil {
		t.Fatal(err)
	}
	var d broker.Delivery
	select {
	case d = <-ch:
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	raw := rawChannel(t, cfg)
	for _, q := range []string{cfg.Prefix + "llmq.lane.high", cfg.Prefix + "llmq.jobs.high",
		cfg.Prefix + "llmq.delay." + rabbitmq.TierName(time.Second)} {
		if _, err := raw.QueueDelete(q, false, false, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Publish(ctx, job.PriorityHigh, broker.Message{Key: "b"}); err == nil {
		t.Fatal("publish to a lane whose queue is deleted succeeded")
	}
	if err := p.PublishIntake(ctx, job.PriorityHigh, broker.Message{Key: "c"}); err == nil {
		t.Fatal("publish to an intake whose queue is deleted succeeded")
	}
	if err := d.Retry(ctx, 1500*time.Millisecond, nil); !errors.Is(err, broker.ErrHandedBack) {
		t.Fatalf("retry to a deleted delay queue: %v, want ErrHandedBack", err)
	}
	select {
	case d = <-ch:
		if d.Message().Key != "a" || !d.Redelivered() {
			t.Fatalf("got %s (redelivered %v), want a handed back", d.Message().Key, d.Redelivered())
		}
	case <-ctx.Done():
		t.Fatal("handed-back delivery not redelivered")
	}
	// The other lanes still work.
	if err := d.Retry(ctx, 0, nil); err != nil {
		t.Fatalf("retry on a lane whose queue exists: %v", err)
	}
}

// An existing deployment: its lane queues (now the intake) are redeclared
// unchanged, a retry still waiting in a retry queue of then flows on to
// the intake, and DeleteTopology removes the old retry exchange and queues.
func TestUpgradeFromRetryExchange(t *testing.T) {
	cfg := testConfig(t).WithDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw := rawChannel(t, cfg)
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}
	oldRetry, oldTier := cfg.Prefix+"llmq.retry", cfg.Prefix+"llmq.retry.200ms"
	jobs := cfg.Prefix + "llmq.jobs"
	declare := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	declare(raw.ExchangeDeclare(jobs, amqp.ExchangeDirect, true, false, false, false, nil))
	declare(raw.ExchangeDeclare(oldRetry, amqp.ExchangeHeaders, true, false, false, false, nil))
	_, err := raw.QueueDeclare(oldTier, true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-message-ttl": int64(200), "x-dead-letter-exchange": jobs,
		"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
	})
	declare(err)
	declare(raw.QueueBind(oldTier, "", oldRetry, false, amqp.Table{"x-match": "all", "llmq-retry-tier": "200ms"}))
	// The queue as earlier versions declared it: arguments must match.
	_, err = raw.QueueDeclare(jobs+".normal", true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-delivery-limit": int64(cfg.DeliveryLimit),
		"x-dead-letter-exchange": cfg.Prefix + "llmq.dlx", "x-dead-letter-strategy": "at-least-once",
		"x-overflow": "reject-publish",
	})
	declare(err)
	declare(raw.QueueBind(jobs+".normal", "normal", jobs, false, nil))

	sub := newIntakeSubscriber(t, cfg) // declares the new topology over the old
	dc, err := raw.PublishWithDeferredConfirmWithContext(ctx, oldRetry, "normal", false, false, amqp.Publishing{
		MessageId: "old-retry", Body: []byte("b"), Headers: amqp.Table{"llmq-retry-tier": "200ms"},
	})
	declare(err)
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publish to the old retry exchange: ok %v, %v", ok, err)
	}
	ch, err := sub.Subscribe(ctx, job.PriorityNormal, 1)
	declare(err)
	select {
	case d := <-ch:
		if d.Message().Key != "old-retry" {
			t.Fatalf("got %s on the intake, want old-retry", d.Message().Key)
		}
		declare(d.Ack(ctx))
	case <-ctx.Done():
		t.Fatal("a message left in an old retry queue did not reach the intake")
	}
	declare(sub.Close())
	declare(rabbitmq.DeleteTopology(ctx, cfg))
	raw = rawChannel(t, cfg)
	if _, err := raw.QueueDeclarePassive(oldTier, true, false, false, false, nil); err == nil {
		t.Fatalf("%s survived DeleteTopology", oldTier)
	}
	raw = rawChannel(t, cfg)
	if err := raw.ExchangeDeclarePassive(oldRetry, amqp.ExchangeHeaders, true, false, false, false, nil); err == nil {
		t.Fatalf("%s survived DeleteTopology", oldRetry)
	}
}
