package kafka_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/job"
)

func receive(t *testing.T, ctx context.Context, ch <-chan broker.Delivery) broker.Delivery {
	t.Helper()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("delivery channel closed")
		}
		return d
	case <-ctx.Done():
		t.Fatal("no delivery")
		return nil
	}
}

// A handed-back delivery keeps its prefetch slot until its re-publish
// succeeds; a Nack whose re-publish fails is redelivered once it does.
func TestHandBackHoldsSlotUntilRepublished(t *testing.T) {
	cfg := testConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newPublisher(t, cfg)
	if err := p.Publish(ctx, job.PriorityNormal, broker.Message{Key: "a", Body: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	ch, err := newSubscriber(t, cfg).Subscribe(ctx, job.PriorityNormal, 1)
	if err != nil {
		t.Fatal(err)
	}
	d := receive(t, ctx, ch)
	lane := cfg.Prefix + broker.LanePrefix + "normal"
	kafka.FailWrites(lane, errBroken)
	t.Cleanup(func() { kafka.FailWrites(lane, nil) })
	if err := d.Nack(ctx); !errors.Is(err, broker.ErrHandedBack) {
		t.Fatalf("nack whose re-publish fails: %v, want ErrHandedBack", err)
	}
	if err := d.Ack(ctx); !errors.Is(err, broker.ErrSettled) {
		t.Fatalf("ack after hand-back: %v, want ErrSettled", err)
	}
	// The one slot is the handed-back delivery's: b waits. (A window, not
	// a proof: b would come within it if the slot were free.)
	if err := p.Publish(ctx, job.PriorityNormal, broker.Message{Key: "b", Body: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-ch:
		t.Fatalf("%s delivered while the only prefetch slot is held", got.Message().Key)
	case <-time.After(time.Second):
	}
	kafka.FailWrites(lane, nil)
	seen := map[string]bool{}
	for len(seen) < 2 {
		got := receive(t, ctx, ch)
		key := got.Message().Key
		if seen[key] {
			t.Fatalf("%s delivered twice", key)
		}
		seen[key] = true
		if key == "a" && !got.Redelivered() {
			t.Fatal("a, re-published by Nack, not marked redelivered")
		}
		if err := got.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("got %v, want a and b", seen)
	}
}

// A subscriber that closes while a re-publish is pending leaves the offset
// uncommitted: the next subscriber reads the message again.
func TestHandBackPendingAtCloseIsReadAgain(t *testing.T) {
	cfg := testConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newPublisher(t, cfg)
	if err := p.Publish(ctx, job.PriorityHigh, broker.Message{Key: "a", Body: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	sub := newSubscriber(t, cfg)
	ch, err := sub.Subscribe(ctx, job.PriorityHigh, 5)
	if err != nil {
		t.Fatal(err)
	}
	d := receive(t, ctx, ch)
	dead := cfg.Prefix + broker.DeadLetterTopic
	kafka.FailWrites(dead, errBroken)
	t.Cleanup(func() { kafka.FailWrites(dead, nil) })
	if err := d.DeadLetter(ctx, broker.DeadLetter{Reason: "x"}); !errors.Is(err, broker.ErrHandedBack) {
		t.Fatalf("dead letter whose publish fails: %v, want ErrHandedBack", err)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	kafka.FailWrites(dead, nil)
	again := receive(t, ctx, subscribeNew(t, ctx, cfg, job.PriorityHigh))
	if again.Message().Key != "a" {
		t.Fatalf("got %s, want a read again", again.Message().Key)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

func subscribeNew(t *testing.T, ctx context.Context, cfg kafka.Config, lane job.Priority) <-chan broker.Delivery {
	t.Helper()
	ch, err := newSubscriber(t, cfg).Subscribe(ctx, lane, 5)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}
