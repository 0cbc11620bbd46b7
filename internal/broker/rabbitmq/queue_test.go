package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// x-max-length with reject-publish, on the intake and on the lanes: past
// the cap, a publish is back-pressure (ErrRejected), not a fault. Quorum
// queues may accept one over the cap.
func TestMaxLengthRejectsPublish(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxLength = 3
	p := newPublisher(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, publish := range map[string]func(context.Context, job.Priority, broker.Message) error{
		"lane": p.Publish, "intake": p.PublishIntake,
	} {
		var err error
		accepted := 0
		for i := 0; i < 10 && err == nil; i++ {
			if err = publish(ctx, job.PriorityLow, broker.Message{Key: fmt.Sprint(i), Body: []byte("x")}); err == nil {
				accepted++
			}
		}
		if !errors.Is(err, broker.ErrRejected) {
			t.Fatalf("%s: publish past x-max-length: %v, want ErrRejected", name, err)
		}
		if accepted < cfg.MaxLength || accepted > cfg.MaxLength+1 {
			t.Fatalf("%s: accepted %d before rejecting, want %d (or one more)", name, accepted, cfg.MaxLength)
		}
		// The other priorities are not affected.
		if err := publish(ctx, job.PriorityHigh, broker.Message{Key: "h", Body: []byte("x")}); err != nil {
			t.Fatalf("%s: publish to another priority: %v", name, err)
		}
	}
}

// Past x-delivery-limit the broker dead-letters the message by itself; the
// dead-letter reader returns it with its body, ReasonDeliveryLimit, its
// priority and whether it died on the intake, and an intake message with
// the user_id RabbitMQ checked at its publish (the reconciler judges its
// tenant by it). A message that waited in a delay queue first still reads
// as dead on its lane.
func TestDeliveryLimitDeadLetters(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		intake, delay, forged bool
	}{{"lane", false, false, false}, {"intake", true, false, false}, {"lane after a delayed retry", false, true, false},
		{"intake, marked as llmq's envelope by its publisher", true, false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.DeliveryLimit = 1
			p := newPublisher(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			body := []byte{0xff, 'p', 'o', 'i', 's', 'o', 'n'}
			var headers amqp.Table
			if tc.forged {
				// Read as an envelope, it would be a lane's dead letter of another body.
				body = []byte(`{"body":"eyJpZCI6IngiLCJ0ZW5hbnQiOiJhY21lIn0=","reason":"forged"}`)
				headers = amqp.Table{"x-llmq-envelope": "1"}
			}
			m := broker.Message{Key: "poison", Body: body}
			publish, sub := p.Publish, newSubscriber(t, cfg)
			user := ""
			if tc.intake {
				u, err := url.Parse(cfg.URL)
				if err != nil {
					t.Fatal(err)
				}
				user = u.User.Username()
				publish, sub = func(ctx context.Context, lane job.Priority, m broker.Message) error {
					return publishAs(ctx, rawChannel(t, cfg), cfg.Prefix+broker.JobsExchange, string(lane), user, headers, m)
				}, newIntakeSubscriber(t, cfg)
			}
			if err := publish(ctx, job.PriorityNormal, m); err != nil {
				t.Fatal(err)
			}
			ch, err := sub.Subscribe(ctx, job.PriorityNormal, 1)
			if err != nil {
				t.Fatal(err)
			}
			receive := func() broker.Delivery {
				t.Helper()
				select {
				case d := <-ch:
					return d
				case <-ctx.Done():
					t.Fatal("delivery not received")
					return nil
				}
			}
			if tc.delay {
				if err := receive().Retry(ctx, 250*time.Millisecond, nil); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < 2; i++ { // first delivery + one redelivery, then the limit
				if err := receive().Nack(ctx); err != nil {
					t.Fatal(err)
				}
			}
			dls, err := newInspector(t, cfg).ReadDeadLetters(ctx, 5)
			if err != nil {
				t.Fatal(err)
			}
			if len(dls) != 1 || string(dls[0].Body) != string(body) || dls[0].Key != "poison" ||
				dls[0].Reason != broker.ReasonDeliveryLimit || dls[0].Lane != job.PriorityNormal ||
				dls[0].FromIntake != tc.intake || dls[0].UserID != user {
				t.Fatalf("dead letters = %+v", dls)
			}
		})
	}
}

// publishAs publishes m raw on ch with user_id user and headers, as a
// tenant's producer does, and waits for the broker's confirm.
func publishAs(ctx context.Context, ch *amqp.Channel, exchange, key, user string, headers amqp.Table, m broker.Message) error {
	if err := ch.Confirm(false); err != nil {
		return err
	}
	c, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false,
		amqp.Publishing{MessageId: m.Key, UserId: user, Headers: headers, DeliveryMode: amqp.Persistent, Body: m.Body})
	if err != nil {
		return err
	}
	if ok, err := c.WaitContext(ctx); err != nil || !ok {
		return fmt.Errorf("publish not confirmed: %v", err)
	}
	return nil
}

func TestConfigValidation(t *testing.T) {
	for name, cfg := range map[string]rabbitmqConfig{
		"no url":           {},
		"tiers descending": {URL: "amqp://x/", RetryTiers: []time.Duration{time.Second, time.Millisecond}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := newPublisherErr(cfg); err == nil {
				t.Fatal("invalid config accepted")
			}
		})
	}
}
