package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

func testPublishConsumeAck(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	p := d.NewPublisher(t)
	msgs := []broker.Message{msg(1), msg(2), msg(3)}
	publish(t, ctx, p, job.PriorityNormal, msgs...)
	if err := p.PublishStatus(ctx, []byte(`{"state":"ok"}`)); err != nil {
		t.Fatalf("PublishStatus: %v", err)
	}
	ch := subscribe(t, ctx, d.NewSubscriber(t), job.PriorityNormal, 10)
	got := receiveKeys(t, ch, len(msgs))
	for _, want := range msgs {
		dv, ok := got[want.Key]
		if !ok {
			t.Fatalf("%s not delivered", want.Key)
		}
		sameMessage(t, dv.Message(), want)
		if dv.Lane() != job.PriorityNormal {
			t.Fatalf("lane = %q, want normal", dv.Lane())
		}
		if dv.Redelivered() {
			t.Fatalf("first delivery of %s marked redelivered", want.Key)
		}
		if err := dv.Ack(ctx); err != nil {
			t.Fatalf("ack: %v", err)
		}
		requireSettled(t, ctx, dv)
	}
}

func testLanesAreSeparate(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	p := d.NewPublisher(t)
	publish(t, ctx, p, job.PriorityHigh, msg(1))
	publish(t, ctx, p, job.PriorityLow, msg(2))
	s := d.NewSubscriber(t)
	got := receive(t, subscribe(t, ctx, s, job.PriorityLow, 1))
	sameMessage(t, got.Message(), msg(2))
	if err := got.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	got = receive(t, subscribe(t, ctx, s, job.PriorityHigh, 1))
	sameMessage(t, got.Message(), msg(1))
	if got.Lane() != job.PriorityHigh {
		t.Fatalf("lane = %q, want high", got.Lane())
	}
	if err := got.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

func testNackRedelivers(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	publish(t, ctx, d.NewPublisher(t), job.PriorityNormal, msg(1))
	ch := subscribe(t, ctx, d.NewSubscriber(t), job.PriorityNormal, 1)
	first := receive(t, ch)
	if err := first.Nack(ctx); err != nil {
		t.Fatalf("nack: %v", err)
	}
	requireSettled(t, ctx, first)
	again := receive(t, ch)
	sameMessage(t, again.Message(), msg(1))
	if d.Features.ExactRedelivered && !again.Redelivered() {
		t.Fatal("redelivery after Nack not marked Redelivered")
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// testAckAllOutOfOrder acks deliveries in an order unlike the delivery
// order, some together (AckAll), some one by one, with the first held back
// until last: each is settled once and none comes back.
func testAckAllOutOfOrder(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	const n = 9
	sub, got := deliverN(t, ctx, d, n)
	var odd []broker.Delivery
	for i := 1; i < n; i += 2 {
		odd = append(odd, got[i])
	}
	for i, err := range broker.AckAll(ctx, odd) {
		if err != nil {
			t.Fatalf("AckAll item %d: %v", i, err)
		}
	}
	for i := n - 1; i >= 2; i -= 2 {
		if err := got[i].Ack(ctx); err != nil {
			t.Fatalf("ack %d: %v", i, err)
		}
	}
	errs := broker.AckAll(ctx, []broker.Delivery{got[1], got[0]})
	if !errors.Is(errs[0], broker.ErrSettled) || errs[1] != nil {
		t.Fatalf("AckAll(settled, unsettled) = %v, want [ErrSettled, nil]", errs)
	}
	for _, dv := range got {
		requireSettled(t, ctx, dv)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	expectOnly(t, ctx, d, nil)
}

// testAcksBeforeCloseStick acks every delivery but the first (which a
// driver that coalesces acks must then hold back), closes the subscriber
// and checks that only the first comes back.
func testAcksBeforeCloseStick(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	const n = 6
	sub, got := deliverN(t, ctx, d, n)
	for i, err := range broker.AckAll(ctx, got[1:3]) {
		if err != nil {
			t.Fatalf("AckAll item %d: %v", i, err)
		}
	}
	for _, dv := range got[3:] {
		if err := dv.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	expectOnly(t, ctx, d, map[string]bool{got[0].Message().Key: true})
}

func testRetryWaitsForDelay(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	publish(t, ctx, d.NewPublisher(t), job.PriorityHigh, msg(1), msg(2))
	ch := subscribe(t, ctx, d.NewSubscriber(t), job.PriorityHigh, 2)
	const delay = 1500 * time.Millisecond
	got := receiveKeys(t, ch, 2)
	first, second := got[msg(1).Key], got[msg(2).Key]
	start := time.Now()
	if err := first.Retry(ctx, delay, map[string]string{"attempt": "2"}); err != nil {
		t.Fatalf("retry: %v", err)
	}
	requireSettled(t, ctx, first)
	// The delayed message holds no consumer: a zero-delay retry of msg(2)
	// flows meanwhile.
	if err := second.Retry(ctx, 0, map[string]string{"attempt": "3"}); err != nil {
		t.Fatalf("retry 0: %v", err)
	}
	for _, key := range []string{msg(1).Key, msg(2).Key} {
		dv := receive(t, ch)
		want, attempt := msg(1), "2"
		if dv.Message().Key == msg(2).Key {
			want, attempt = msg(2), "3"
		} else if elapsed := time.Since(start); elapsed < delay {
			t.Fatalf("delayed retry arrived after %v, before its delay %v", elapsed, delay)
		}
		want.Headers["attempt"] = attempt
		sameMessage(t, dv.Message(), want)
		if dv.Lane() != job.PriorityHigh {
			t.Fatalf("%s retried on lane %q, want high", key, dv.Lane())
		}
		if err := dv.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Each retry comes back once: no copy arrives from another holding
	// queue or tier. The window covers the tiers a 1.5 s delay can touch.
	expectNoDelivery(t, ch, 3*delay)
}

func testDeadLetterKeepsBody(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	m := msg(7)
	m.Body = append([]byte{0xff, 0x00, 0xfe}, m.Body...) // not UTF-8: byte for byte
	publish(t, ctx, d.NewPublisher(t), job.PriorityLow, m)
	ch := subscribe(t, ctx, d.NewSubscriber(t), job.PriorityLow, 1)
	got := receive(t, ch)
	first := time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	if err := got.DeadLetter(ctx, broker.DeadLetter{
		Body: got.Message().Body, Key: got.Message().Key, Reason: "max_attempts",
		Attempts: 5, LastError: "provider 500", FirstFailedAt: first,
		LastFailedAt: first.Add(time.Minute), Lane: got.Lane(),
	}); err != nil {
		t.Fatalf("dead letter: %v", err)
	}
	requireSettled(t, ctx, got)
	dls, err := d.DeadLetters(t).ReadDeadLetters(ctx, 10)
	if err != nil {
		t.Fatalf("read dead letters: %v", err)
	}
	if len(dls) != 1 {
		t.Fatalf("got %d dead letters, want 1", len(dls))
	}
	dl := dls[0]
	if !bytes.Equal(dl.Body, m.Body) || dl.Key != m.Key || dl.Reason != "max_attempts" ||
		dl.Attempts != 5 || dl.LastError != "provider 500" || dl.Lane != job.PriorityLow ||
		!dl.FirstFailedAt.Equal(first) {
		t.Fatalf("dead letter = %+v, want body %q reason max_attempts", dl, m.Body)
	}
}

// testDepth: Depth counts what waits for a priority on its lane and on its
// intake, and drops as either is consumed.
func testDepth(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	in := d.NewInspector(t)
	p := d.NewPublisher(t)
	for i := 0; i < 7; i++ {
		publish(t, ctx, p, job.PriorityLow, msg(i))
	}
	for i := 10; i < 13; i++ {
		publishIntake(t, ctx, p, job.PriorityLow, msg(i))
	}
	publish(t, ctx, p, job.PriorityHigh, msg(100))
	publishIntake(t, ctx, p, job.PriorityNormal, msg(101))
	depthIs := func(lane job.Priority, want int64) func() (bool, error) {
		return func() (bool, error) {
			n, err := in.Depth(ctx, lane)
			if err != nil {
				return false, err
			}
			return n == want, fmt.Errorf("depth %s = %d, want %d", lane, n, want)
		}
	}
	waitFor(t, "depth low 7+3", depthIs(job.PriorityLow, 10))
	waitFor(t, "depth high 1", depthIs(job.PriorityHigh, 1))
	waitFor(t, "depth normal 1 (intake)", depthIs(job.PriorityNormal, 1))
	ch := subscribe(t, ctx, d.NewSubscriber(t), job.PriorityLow, 10)
	for i := 0; i < 7; i++ {
		if err := receive(t, ch).Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "depth low 3 after the lane's acks", depthIs(job.PriorityLow, 3))
	ch = subscribe(t, ctx, d.NewIntakeSubscriber(t), job.PriorityLow, 10)
	for i := 0; i < 3; i++ {
		if err := receive(t, ch).Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "depth low 0 after the intake's acks", depthIs(job.PriorityLow, 0))
}

func testCancelDrainsThenCloseReturns(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	var msgs []broker.Message
	for i := 0; i < 5; i++ {
		msgs = append(msgs, msg(i))
	}
	publish(t, ctx, d.NewPublisher(t), job.PriorityNormal, msgs...)
	sub1 := d.NewSubscriber(t)
	subCtx, cancel := context.WithCancel(ctx)
	ch := subscribe(t, subCtx, sub1, job.PriorityNormal, 5)
	var held []broker.Delivery
	for i := 0; i < 5; i++ {
		held = append(held, receive(t, ch))
	}
	// ctx ends: no new deliveries, but the held ones can still be settled.
	cancel()
	waitClosed(t, ctx, ch)
	acked := map[string]bool{}
	for _, dv := range held[:2] {
		if err := dv.Ack(ctx); err != nil {
			t.Fatalf("ack after ctx end (drain): %v", err)
		}
		acked[dv.Message().Key] = true
	}
	// Close hands the rest back.
	if err := sub1.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := held[2].Ack(ctx); err == nil {
		t.Fatal("ack after Close succeeded, want an error (message is handed back)")
	}
	ch2 := subscribe(t, ctx, d.NewSubscriber(t), job.PriorityNormal, 5)
	want := map[string]bool{}
	for _, dv := range held[2:] {
		want[dv.Message().Key] = true
	}
	for len(want) > 0 {
		dv := receive(t, ch2)
		key := dv.Message().Key
		if acked[key] {
			if !d.Features.DuplicatesOnReturn {
				t.Fatalf("acked message %s delivered again", key)
			}
		} else {
			if !want[key] {
				t.Fatalf("unexpected delivery %s", key)
			}
			if d.Features.ExactRedelivered && !dv.Redelivered() {
				t.Fatalf("returned message %s not marked Redelivered", key)
			}
			delete(want, key)
		}
		if err := dv.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func testTenThousand(t *testing.T, d Driver) {
	const n, publishers = 10000, 32
	// A deadline for the whole run, generous for a loaded 2-core machine
	// under the race detector; not a timing assertion.
	ctx, cancel := context.WithTimeout(context.Background(), 4*Wait)
	defer cancel()
	p := d.NewPublisher(t)
	s := d.NewSubscriber(t)
	ch := subscribe(t, ctx, s, job.PriorityNormal, 100)
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for w := 0; w < publishers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += publishers {
				if err := p.Publish(ctx, job.PriorityNormal, msg(i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	seen := make(map[string]bool, n)
	for len(seen) < n {
		dv := receive(t, ch)
		key := dv.Message().Key
		if seen[key] {
			t.Fatalf("%s delivered twice", key)
		}
		seen[key] = true
		if err := dv.Ack(ctx); err != nil {
			t.Fatalf("ack %s: %v", key, err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("publish: %v", err)
	}
}

func testPrefetch(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	const total, prefetch = 10, 3
	p := d.NewPublisher(t)
	for i := 0; i < total; i++ {
		publish(t, ctx, p, job.PriorityNormal, msg(i))
	}
	ch1 := subscribe(t, ctx, d.NewSubscriber(t), job.PriorityNormal, prefetch)
	var held []broker.Delivery
	for i := 0; i < prefetch; i++ {
		held = append(held, receive(t, ch1))
	}
	if d.Features.CompetingConsumers {
		// If the first subscription had taken more than its prefetch, the
		// second could not receive all the rest.
		ch2 := subscribe(t, ctx, d.NewSubscriber(t), job.PriorityNormal, total)
		for i := 0; i < total-prefetch; i++ {
			if err := receive(t, ch2).Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	select {
	case dv := <-ch1:
		t.Fatalf("delivery %s beyond prefetch %d", dv.Message().Key, prefetch)
	default:
	}
	// Settling one frees one slot.
	if err := held[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if !d.Features.CompetingConsumers {
		_ = receive(t, ch1)
	}
}

func testClosedClients(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	p := d.NewPublisher(t)
	if err := p.Close(); err != nil {
		t.Fatalf("close publisher: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second close publisher: %v", err)
	}
	if err := p.Publish(ctx, job.PriorityNormal, msg(1)); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("publish after close: %v, want ErrClosed", err)
	}
	if err := p.PublishIntake(ctx, job.PriorityNormal, msg(1)); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("publish to the intake after close: %v, want ErrClosed", err)
	}
	for _, s := range []broker.Subscriber{d.NewSubscriber(t), d.NewIntakeSubscriber(t)} {
		if err := s.Close(); err != nil {
			t.Fatalf("close subscriber: %v", err)
		}
		if _, err := s.Subscribe(ctx, job.PriorityNormal, 1); !errors.Is(err, broker.ErrClosed) {
			t.Fatalf("subscribe after close: %v, want ErrClosed", err)
		}
	}
}
