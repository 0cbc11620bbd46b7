package kafka_test

import (
	"context"
	"errors"
	"testing"

	"github.com/llmq/llmq/internal/leakcheck"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/brokertest"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func testConfig(t testing.TB) kafka.Config {
	return kafka.Config{Brokers: testsvc.KafkaBrokers(t), Prefix: testsvc.KafkaPrefix(t)}
}

func newPublisher(t testing.TB, cfg kafka.Config) *kafka.Publisher {
	p, err := kafka.NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new publisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func newSubscriber(t testing.TB, cfg kafka.Config) *kafka.Subscriber {
	s, err := kafka.NewSubscriber(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new subscriber: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newIntakeSubscriber(t testing.TB, cfg kafka.Config) *kafka.Subscriber {
	s, err := kafka.NewIntakeSubscriber(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new intake subscriber: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newInspector(t testing.TB, cfg kafka.Config) *kafka.Inspector {
	in, err := kafka.NewInspector(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new inspector: %v", err)
	}
	t.Cleanup(func() { _ = in.Close() })
	return in
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) brokertest.Driver {
		cfg := testConfig(t)
		return brokertest.Driver{
			NewPublisher:  func(t *testing.T) broker.Publisher { return newPublisher(t, cfg) },
			NewSubscriber: func(t *testing.T) broker.Subscriber { return newSubscriber(t, cfg) },
			NewIntakeSubscriber: func(t *testing.T) broker.Subscriber {
				return newIntakeSubscriber(t, cfg)
			},
			NewInspector:             func(t *testing.T) broker.Inspector { return newInspector(t, cfg) },
			DeadLetters:              func(t *testing.T) broker.DeadLetterReader { return newInspector(t, cfg) },
			BreakRetryPublishes:      breakWrites(cfg.Prefix + "llmq.jobs.retry"),
			BreakDeadLetterPublishes: breakWrites(cfg.Prefix + broker.DeadLetterTopic),
			Features:                 brokertest.Features{DuplicatesOnReturn: true, HandBackRepublishes: true},
		}
	})
}

var errBroken = errors.New("writes broken by the test")

// breakWrites is a brokertest.Driver hook: Subscribers' writes to topic
// fail until restore.
func breakWrites(topic string) func(t *testing.T) func() {
	return func(t *testing.T) func() {
		kafka.FailWrites(topic, errBroken)
		restore := func() { kafka.FailWrites(topic, nil) }
		t.Cleanup(restore)
		return restore
	}
}
