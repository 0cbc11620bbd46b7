package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// x-max-length with reject-publish: past the cap, Publish is back-pressure
// (ErrRejected), not a fault. Quorum queues may accept one over the cap.
func TestMaxLengthRejectsPublish(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxLength = 3
	p := newPublisher(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	accepted := 0
	for i := 0; i < 10 && err == nil; i++ {
		if err = p.Publish(ctx, job.PriorityLow, broker.Message{Key: fmt.Sprint(i), Body: []byte("x")}); err == nil {
			accepted++
		}
	}
	if !errors.Is(err, broker.ErrRejected) {
		t.Fatalf("publish past x-max-length: %v, want ErrRejected", err)
	}
	if accepted < cfg.MaxLength || accepted > cfg.MaxLength+1 {
		t.Fatalf("accepted %d before rejecting, want %d (or one more)", accepted, cfg.MaxLength)
	}
	// The other lanes are not affected.
	if err := p.Publish(ctx, job.PriorityHigh, broker.Message{Key: "h", Body: []byte("x")}); err != nil {
		t.Fatalf("publish to another lane: %v", err)
	}
}

// Past x-delivery-limit the broker dead-letters the message by itself; the
// dead-letter reader returns it with its body and ReasonDeliveryLimit.
func TestDeliveryLimitDeadLetters(t *testing.T) {
	cfg := testConfig(t)
	cfg.DeliveryLimit = 1
	p := newPublisher(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := []byte{0xff, 'p', 'o', 'i', 's', 'o', 'n'}
	if err := p.Publish(ctx, job.PriorityNormal, broker.Message{Key: "poison", Body: body}); err != nil {
		t.Fatal(err)
	}
	ch, err := newSubscriber(t, cfg).Subscribe(ctx, job.PriorityNormal, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // first delivery + one redelivery, then the limit
		var d broker.Delivery
		select {
		case d = <-ch:
		case <-ctx.Done():
			t.Fatalf("delivery %d not received", i+1)
		}
		if err := d.Nack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	dls, err := newInspector(t, cfg).ReadDeadLetters(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || string(dls[0].Body) != string(body) || dls[0].Key != "poison" ||
		dls[0].Reason != broker.ReasonDeliveryLimit || dls[0].Lane != job.PriorityNormal {
		t.Fatalf("dead letters = %+v", dls)
	}
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
