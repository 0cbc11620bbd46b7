package brokertest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// testFailedRetryPublishHandsBack: a delayed Retry whose publish the broker
// refuses hands the delivery back instead of leaving it unsettled; the lane
// keeps flowing, and once publishes work again the retry arrives.
func testFailedRetryPublishHandsBack(t *testing.T, d Driver) {
	if d.BreakRetryPublishes == nil {
		t.Skip("the driver has no BreakRetryPublishes hook to make retry publishes fail")
	}
	const delay = 300 * time.Millisecond
	retry := func(ctx context.Context, dv broker.Delivery) error {
		return dv.Retry(ctx, delay, map[string]string{"attempt": "2"})
	}
	testFailedSettlePublish(t, d, d.BreakRetryPublishes, retry, func(ctx context.Context, ch <-chan broker.Delivery) {
		dv := receive(t, ch)
		want := msg(1)
		want.Headers["attempt"] = "2"
		sameMessage(t, dv.Message(), want)
		if err := dv.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		expectNoDelivery(t, ch, 3*delay)
	})
}

// testFailedDeadLetterPublishHandsBack: the same for DeadLetter; once
// publishes work again the envelope reaches the dead-letter queue.
func testFailedDeadLetterPublishHandsBack(t *testing.T, d Driver) {
	if d.BreakDeadLetterPublishes == nil {
		t.Skip("the driver has no BreakDeadLetterPublishes hook to make dead-letter publishes fail")
	}
	deadLetter := func(ctx context.Context, dv broker.Delivery) error {
		return dv.DeadLetter(ctx, broker.DeadLetter{Reason: "max_attempts", Attempts: 3})
	}
	testFailedSettlePublish(t, d, d.BreakDeadLetterPublishes, deadLetter, func(ctx context.Context, ch <-chan broker.Delivery) {
		dls, err := d.DeadLetters(t).ReadDeadLetters(ctx, 10)
		if err != nil {
			t.Fatalf("read dead letters: %v", err)
		}
		want := msg(1)
		if len(dls) != 1 || dls[0].Key != want.Key || !bytes.Equal(dls[0].Body, want.Body) ||
			dls[0].Reason != "max_attempts" || dls[0].Attempts != 3 || dls[0].Lane != job.PriorityNormal {
			t.Fatalf("dead letters = %+v, want one for %s", dls, want.Key)
		}
		expectNoDelivery(t, ch, 500*time.Millisecond)
	})
}

// testFailedSettlePublish breaks the publishes settle needs (brk), settles
// a delivery with it and checks that the call reports ErrHandedBack, that
// the delivery is settled, that the lane keeps flowing (every prefetch slot
// but one the driver keeps for its background re-publish is free), and
// that the message is not lost: RabbitMQ and memory redeliver it at once,
// and it is settled again once publishes work; a driver with
// HandBackRepublishes publishes it by itself once they work. done checks
// the outcome of the settlement that finally succeeded.
func testFailedSettlePublish(t *testing.T, d Driver, brk func(*testing.T) func(),
	settle func(context.Context, broker.Delivery) error, done func(context.Context, <-chan broker.Delivery)) {
	ctx := ctxFor(t)
	const lane, prefetch = job.PriorityNormal, 2
	p := d.NewPublisher(t)
	victim := msg(1)
	publish(t, ctx, p, lane, victim)
	ch := subscribe(t, ctx, d.NewSubscriber(t), lane, prefetch)
	first := receive(t, ch)
	restore := brk(t)
	err := settle(ctx, first)
	if !errors.Is(err, broker.ErrHandedBack) {
		t.Fatalf("settlement whose publish fails: %v, want an error wrapping ErrHandedBack", err)
	}
	requireSettled(t, ctx, first)

	var others []broker.Message
	for i := 10; i < 14; i++ {
		others = append(others, msg(i))
	}
	publish(t, ctx, p, lane, others...)
	free := prefetch
	if d.Features.HandBackRepublishes {
		free--
	}
	// Held all at once: the slots are free.
	var held []broker.Delivery
	for i := 0; i < free; i++ {
		held = append(held, receive(t, ch))
	}
	var back broker.Delivery
	seen := map[string]bool{}
	take := func(dv broker.Delivery) {
		key := dv.Message().Key
		switch {
		case key == victim.Key && d.Features.HandBackRepublishes:
			t.Fatalf("%s redelivered, though the driver re-publishes it itself", key)
		case key == victim.Key && back != nil:
			t.Fatalf("%s handed back twice", key)
		case key == victim.Key:
			back = dv
			return
		case seen[key]:
			t.Fatalf("%s delivered twice", key)
		}
		seen[key] = true
		if err := dv.Ack(ctx); err != nil {
			t.Fatalf("ack %s: %v", key, err)
		}
	}
	for _, dv := range held {
		take(dv)
	}
	for len(seen) < len(others) || (back == nil && !d.Features.HandBackRepublishes) {
		take(receive(t, ch))
	}
	if back != nil {
		sameMessage(t, back.Message(), victim)
		if d.Features.ExactRedelivered && !back.Redelivered() {
			t.Fatal("handed-back message not marked Redelivered")
		}
	}
	restore()
	if back != nil {
		if err := settle(ctx, back); err != nil {
			t.Fatalf("settlement after publishes work again: %v", err)
		}
	}
	done(ctx, ch)
}
