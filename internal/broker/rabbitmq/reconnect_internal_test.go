package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/testsvc"
)

// dropConnection closes the session's current connection under its users,
// as a network failure would.
func dropConnection(t *testing.T, s *session) {
	t.Helper()
	s.lock <- struct{}{}
	conn := s.conn
	<-s.lock
	if conn == nil {
		t.Fatal("no connection to drop")
	}
	_ = conn.Close()
}

// A dropped connection: the subscription resumes on the same channel, an ack
// on the dead channel fails and that message comes back, publishes go on.
func TestDroppedConnectionResumes(t *testing.T) {
	cfg := Config{URL: testsvc.AMQPURL(t), Prefix: testsvc.AMQPPrefix(t), ReconnectMin: 20 * time.Millisecond}
	t.Cleanup(func() { _ = DeleteTopology(context.Background(), cfg) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := NewPublisher(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, err := NewSubscriber(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 20
	for i := 0; i < n/2; i++ {
		if err := p.Publish(ctx, job.PriorityNormal, broker.Message{Key: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	ch, err := s.Subscribe(ctx, job.PriorityNormal, 5)
	if err != nil {
		t.Fatal(err)
	}
	held := <-ch
	dropConnection(t, s.s)
	dropConnection(t, p.s)
	if err := held.Ack(ctx); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("ack on a dropped channel: %v, want ErrClosed", err)
	}
	for i := n / 2; i < n; i++ {
		if err := p.Publish(ctx, job.PriorityNormal, broker.Message{Key: fmt.Sprint(i)}); err != nil {
			t.Fatalf("publish after drop: %v", err)
		}
	}
	seen := map[string]bool{}
	for len(seen) < n {
		select {
		case d, ok := <-ch:
			if !ok {
				t.Fatal("subscription channel closed by a dropped connection")
			}
			if err := d.Ack(ctx); errors.Is(err, broker.ErrClosed) {
				continue // handed out just as its channel died: it comes back
			} else if err != nil {
				t.Fatalf("ack after resume: %v", err)
			}
			if d.Message().Key == held.Message().Key && !d.Redelivered() {
				t.Fatal("message whose ack was lost not marked redelivered")
			}
			seen[d.Message().Key] = true
		case <-ctx.Done():
			t.Fatalf("received %d of %d after the drop", len(seen), n)
		}
	}
}
