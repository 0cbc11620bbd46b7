package brokertest

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// testIntakeToLane: PublishIntake reaches the intake subscriber byte for
// byte, key and headers included, and never the lane.
func testIntakeToLane(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	p := d.NewPublisher(t)
	lane := subscribe(t, ctx, d.NewSubscriber(t), job.PriorityNormal, 10)
	m := msg(1)
	m.Body = append([]byte{0xff, 0x00, 0xfe}, m.Body...) // not UTF-8: byte for byte
	publishIntake(t, ctx, p, job.PriorityNormal, m)
	got := receive(t, subscribe(t, ctx, d.NewIntakeSubscriber(t), job.PriorityNormal, 10))
	exactMessage(t, got.Message(), m)
	if got.Lane() != job.PriorityNormal {
		t.Fatalf("intake delivery's lane = %q, want normal", got.Lane())
	}
	if got.Redelivered() {
		t.Fatal("first intake delivery marked redelivered")
	}
	if err := got.Ack(ctx); err != nil {
		t.Fatalf("ack on the intake: %v", err)
	}
	requireSettled(t, ctx, got)
	expectFirst(t, ctx, lane, m.Key, func(s broker.Message) { publish(t, ctx, p, job.PriorityNormal, s) })
}

// testPublishGoesToLane: Publish reaches the lane subscriber and never the
// intake.
func testPublishGoesToLane(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	p := d.NewPublisher(t)
	intake := subscribe(t, ctx, d.NewIntakeSubscriber(t), job.PriorityHigh, 10)
	m := msg(2)
	publish(t, ctx, p, job.PriorityHigh, m)
	got := receive(t, subscribe(t, ctx, d.NewSubscriber(t), job.PriorityHigh, 10))
	exactMessage(t, got.Message(), m)
	if err := got.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	expectFirst(t, ctx, intake, m.Key, func(s broker.Message) { publishIntake(t, ctx, p, job.PriorityHigh, s) })
}

// expectFirst publishes (with pub) a sentinel keyed key and checks it is
// the first delivery on ch: a message with the same key published earlier
// would have come first (on Kafka the same key is the same partition).
func expectFirst(t *testing.T, ctx context.Context, ch <-chan broker.Delivery, key string, pub func(broker.Message)) {
	t.Helper()
	sentinel := broker.Message{Key: key, Body: []byte(`{"sentinel":true}`)}
	pub(sentinel)
	first := receive(t, ch)
	if !bytes.Equal(first.Message().Body, sentinel.Body) {
		t.Fatalf("got %s %q where only the sentinel was published, want the sentinel", first.Message().Key, first.Message().Body)
	}
	if err := first.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// exactMessage requires got to be want exactly: key, body and headers.
func exactMessage(t *testing.T, got, want broker.Message) {
	t.Helper()
	sameMessage(t, got, want)
	if !maps.Equal(got.Headers, want.Headers) {
		t.Fatalf("headers = %v, want exactly %v", got.Headers, want.Headers)
	}
}

// testIntakeSettlements: on intake deliveries AckAll, Nack and DeadLetter
// work as on a lane, Retry hands the delivery back, and nothing settled
// comes back.
func testIntakeSettlements(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	const lane = job.PriorityHigh
	p := d.NewPublisher(t)
	var msgs []broker.Message
	for i := 1; i <= 5; i++ {
		msgs = append(msgs, msg(i))
	}
	publishIntake(t, ctx, p, lane, msgs...)
	sub := d.NewIntakeSubscriber(t)
	ch := subscribe(t, ctx, sub, lane, len(msgs))
	got := receiveKeys(t, ch, len(msgs))
	dv := func(i int) broker.Delivery { return got[msgs[i].Key] }
	for i, err := range broker.AckAll(ctx, []broker.Delivery{dv(0), dv(1)}) {
		if err != nil {
			t.Fatalf("AckAll item %d: %v", i, err)
		}
	}
	requireSettled(t, ctx, dv(0))
	if err := dv(2).DeadLetter(ctx, broker.DeadLetter{Reason: "malformed", LastError: "not JSON"}); err != nil {
		t.Fatalf("dead letter on the intake: %v", err)
	}
	requireSettled(t, ctx, dv(2))
	if err := dv(3).Nack(ctx); err != nil {
		t.Fatalf("nack on the intake: %v", err)
	}
	requireSettled(t, ctx, dv(3))
	err := dv(4).Retry(ctx, time.Second, map[string]string{"attempt": "2"})
	if !errors.Is(err, broker.ErrHandedBack) {
		t.Fatalf("retry on the intake: %v, want an error wrapping ErrHandedBack", err)
	}
	requireSettled(t, ctx, dv(4))
	back := receiveKeys(t, ch, 2)
	for _, want := range msgs[3:] {
		b, ok := back[want.Key]
		if !ok {
			t.Fatalf("%s (nacked or retried on the intake) did not come back; got %v", want.Key, keys(back))
		}
		exactMessage(t, b.Message(), want) // a refused Retry adds no headers
		if b.Lane() != lane {
			t.Fatalf("lane = %q, want %q", b.Lane(), lane)
		}
		if d.Features.ExactRedelivered && !b.Redelivered() {
			t.Fatalf("%s handed back on the intake not marked Redelivered", want.Key)
		}
		if err := b.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	dls, err := d.DeadLetters(t).ReadDeadLetters(ctx, 10)
	if err != nil {
		t.Fatalf("read dead letters: %v", err)
	}
	if len(dls) != 1 {
		t.Fatalf("got %d dead letters, want 1: %+v", len(dls), dls)
	}
	if dl := dls[0]; dl.Key != msgs[2].Key || !bytes.Equal(dl.Body, msgs[2].Body) || dl.Reason != "malformed" ||
		dl.Lane != lane || !dl.FromIntake {
		t.Fatalf("dead letter = %+v, want %s from the intake of %s", dl, msgs[2].Key, lane)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	expectOnlyOn(t, ctx, d, true, lane, nil)
}

func keys(m map[string]broker.Delivery) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
