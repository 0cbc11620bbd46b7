package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	t.Cleanup(cancel)
	return ctx
}

// receive waits for the next delivery or fails the test.
func receive(t *testing.T, ch <-chan broker.Delivery) broker.Delivery {
	t.Helper()
	timer := time.NewTimer(Wait)
	defer timer.Stop()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("delivery channel closed, want a delivery")
		}
		return d
	case <-timer.C:
		t.Fatalf("no delivery within %v", Wait)
		return nil
	}
}

// waitClosed drains ch until it closes, handing back anything still
// arriving, or fails the test.
func waitClosed(t *testing.T, ctx context.Context, ch <-chan broker.Delivery) {
	t.Helper()
	timer := time.NewTimer(Wait)
	defer timer.Stop()
	for {
		select {
		case d, ok := <-ch:
			if !ok {
				return
			}
			_ = d.Nack(ctx)
		case <-timer.C:
			t.Fatalf("delivery channel not closed within %v", Wait)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(Wait)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v (last error: %v)", what, Wait, err)
		}
		<-tick.C
	}
}

func msg(i int) broker.Message {
	return broker.Message{
		Key:     fmt.Sprintf("job-%05d", i),
		Body:    []byte(fmt.Sprintf(`{"id":"job-%05d","model":"m","request":{}}`, i)),
		Headers: map[string]string{"tenant": "t1", "n": fmt.Sprint(i)},
	}
}

func publish(t *testing.T, ctx context.Context, p broker.Publisher, lane job.Priority, msgs ...broker.Message) {
	t.Helper()
	for _, m := range msgs {
		if err := p.Publish(ctx, lane, m); err != nil {
			t.Fatalf("publish %s: %v", m.Key, err)
		}
	}
}

func publishIntake(t *testing.T, ctx context.Context, p broker.Publisher, lane job.Priority, msgs ...broker.Message) {
	t.Helper()
	for _, m := range msgs {
		if err := p.PublishIntake(ctx, lane, m); err != nil {
			t.Fatalf("publish %s to the intake: %v", m.Key, err)
		}
	}
}

func subscribe(t *testing.T, ctx context.Context, s broker.Subscriber, lane job.Priority, prefetch int) <-chan broker.Delivery {
	t.Helper()
	ch, err := s.Subscribe(ctx, lane, prefetch)
	if err != nil {
		t.Fatalf("subscribe %s: %v", lane, err)
	}
	return ch
}

func sameMessage(t *testing.T, got, want broker.Message) {
	t.Helper()
	if got.Key != want.Key || !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("got message %q %q, want %q %q", got.Key, got.Body, want.Key, want.Body)
	}
	for k, v := range want.Headers {
		if got.Headers[k] != v {
			t.Fatalf("header %q = %q, want %q (all: %v)", k, got.Headers[k], v, got.Headers)
		}
	}
}

func requireSettled(t *testing.T, ctx context.Context, d broker.Delivery) {
	t.Helper()
	if err := d.Ack(ctx); !errors.Is(err, broker.ErrSettled) {
		t.Fatalf("second Ack: %v, want ErrSettled", err)
	}
	if err := d.Nack(ctx); !errors.Is(err, broker.ErrSettled) {
		t.Fatalf("Nack after settlement: %v, want ErrSettled", err)
	}
	if err := d.Retry(ctx, 0, nil); !errors.Is(err, broker.ErrSettled) {
		t.Fatalf("Retry after settlement: %v, want ErrSettled", err)
	}
	if err := d.DeadLetter(ctx, broker.DeadLetter{Reason: "x"}); !errors.Is(err, broker.ErrSettled) {
		t.Fatalf("DeadLetter after settlement: %v, want ErrSettled", err)
	}
}

// receiveKeys receives n deliveries and indexes them by key (Kafka keeps
// order only within a partition, so no case relies on order across keys).
func receiveKeys(t *testing.T, ch <-chan broker.Delivery, n int) map[string]broker.Delivery {
	t.Helper()
	out := make(map[string]broker.Delivery, n)
	for len(out) < n {
		d := receive(t, ch)
		if _, dup := out[d.Message().Key]; dup {
			t.Fatalf("%s delivered twice", d.Message().Key)
		}
		out[d.Message().Key] = d
	}
	return out
}

// deliverN publishes n normal-lane messages, subscribes with prefetch n
// and returns the subscriber and the n deliveries, unsettled.
func deliverN(t *testing.T, ctx context.Context, d Driver, n int) (broker.Subscriber, []broker.Delivery) {
	t.Helper()
	for i := 0; i < n; i++ {
		publish(t, ctx, d.NewPublisher(t), job.PriorityNormal, msg(i))
	}
	sub := d.NewSubscriber(t)
	ch := subscribe(t, ctx, sub, job.PriorityNormal, n)
	got := make([]broker.Delivery, 0, n)
	for i := 0; i < n; i++ {
		got = append(got, receive(t, ch))
	}
	return sub, got
}

// expectOnly publishes a sentinel on the normal lane and consumes until it
// arrives: every key of want must come first or along the way, and no
// other key may (unless the driver may return acked messages).
func expectOnly(t *testing.T, ctx context.Context, d Driver, want map[string]bool) {
	t.Helper()
	expectOnlyOn(t, ctx, d, false, job.PriorityNormal, want)
}

// expectOnlyOn is expectOnly on the intake (intake) or a lane of priority
// lane.
func expectOnlyOn(t *testing.T, ctx context.Context, d Driver, intake bool, lane job.Priority, want map[string]bool) {
	t.Helper()
	sentinel := msg(99999)
	var ch <-chan broker.Delivery
	if intake {
		publishIntake(t, ctx, d.NewPublisher(t), lane, sentinel)
		ch = subscribe(t, ctx, d.NewIntakeSubscriber(t), lane, 10)
	} else {
		publish(t, ctx, d.NewPublisher(t), lane, sentinel)
		ch = subscribe(t, ctx, d.NewSubscriber(t), lane, 10)
	}
	missing := maps.Clone(want)
	sawSentinel := false
	for !sawSentinel || len(missing) > 0 {
		dv := receive(t, ch)
		key := dv.Message().Key
		switch {
		case key == sentinel.Key:
			sawSentinel = true
		case want[key]:
			delete(missing, key)
		case !d.Features.DuplicatesOnReturn:
			t.Fatalf("acked message %s delivered again", key)
		}
		if err := dv.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// expectNoDelivery fails if anything arrives on ch within window.
func expectNoDelivery(t *testing.T, ch <-chan broker.Delivery, window time.Duration) {
	t.Helper()
	timer := time.NewTimer(window)
	defer timer.Stop()
	select {
	case dv, ok := <-ch:
		if ok {
			t.Fatalf("unexpected extra delivery of %s (a duplicate)", dv.Message().Key)
		}
	case <-timer.C:
	}
}
