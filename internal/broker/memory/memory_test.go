package memory_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmq/llmq/internal/leakcheck"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/brokertest"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/job"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) brokertest.Driver {
		b := memory.New(memory.Config{})
		t.Cleanup(func() { _ = b.Close() })
		return brokertest.Driver{
			NewPublisher: func(t *testing.T) broker.Publisher {
				p := b.Publisher()
				t.Cleanup(func() { _ = p.Close() })
				return p
			},
			NewSubscriber: func(t *testing.T) broker.Subscriber {
				s := b.Subscriber()
				t.Cleanup(func() { _ = s.Close() })
				return s
			},
			NewIntakeSubscriber: func(t *testing.T) broker.Subscriber {
				s := b.IntakeSubscriber()
				t.Cleanup(func() { _ = s.Close() })
				return s
			},
			NewInspector: func(t *testing.T) broker.Inspector { return b.Inspector() },
			DeadLetters:  func(t *testing.T) broker.DeadLetterReader { return b },
			BreakRetryPublishes: func(t *testing.T) func() {
				b.FailRetries(errBroken)
				restore := func() { b.FailRetries(nil) }
				t.Cleanup(restore)
				return restore
			},
			BreakDeadLetterPublishes: func(t *testing.T) func() {
				b.FailDeadLetters(errBroken)
				restore := func() { b.FailDeadLetters(nil) }
				t.Cleanup(restore)
				return restore
			},
			Features: brokertest.Features{ExactRedelivered: true, CompetingConsumers: true},
		}
	})
}

var errBroken = errors.New("publishes broken by the test")

func TestMaxLengthRejects(t *testing.T) {
	b := memory.New(memory.Config{MaxLength: 2})
	defer b.Close()
	p := b.Publisher()
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if err := p.Publish(ctx, job.PriorityLow, broker.Message{Key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Publish(ctx, job.PriorityLow, broker.Message{Key: "k"}); !errors.Is(err, broker.ErrRejected) {
		t.Fatalf("publish past max length: %v, want ErrRejected", err)
	}
}

// A 10-minute retry delay runs in virtual time under synctest.
func TestRetryDelayVirtualTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memory.New(memory.Config{})
		defer b.Close()
		ctx := context.Background()
		if err := b.Publisher().Publish(ctx, job.PriorityHigh, broker.Message{Key: "a", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		s := b.Subscriber()
		defer s.Close()
		ch, err := s.Subscribe(ctx, job.PriorityHigh, 1)
		if err != nil {
			t.Fatal(err)
		}
		d := <-ch
		start := time.Now()
		if err := d.Retry(ctx, 10*time.Minute, map[string]string{"attempt": "2"}); err != nil {
			t.Fatal(err)
		}
		d = <-ch
		if got := time.Since(start); got != 10*time.Minute {
			t.Fatalf("retry arrived after %v, want 10m", got)
		}
		if d.Message().Headers["attempt"] != "2" {
			t.Fatalf("headers %v", d.Message().Headers)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
