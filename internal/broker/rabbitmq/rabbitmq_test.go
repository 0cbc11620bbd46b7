package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/leakcheck"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/brokertest"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// testConfig is a config on its own prefix, whose topology is deleted when
// the test ends.
func testConfig(t testing.TB) rabbitmq.Config {
	cfg := rabbitmq.Config{URL: testsvc.AMQPURL(t), Prefix: testsvc.AMQPPrefix(t),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rabbitmq.DeleteTopology(ctx, cfg); err != nil {
			t.Errorf("delete topology: %v", err)
		}
	})
	return cfg
}

func newPublisher(t testing.TB, cfg rabbitmq.Config) *rabbitmq.Publisher {
	p, err := rabbitmq.NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new publisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func newSubscriber(t testing.TB, cfg rabbitmq.Config) *rabbitmq.Subscriber {
	s, err := rabbitmq.NewSubscriber(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new subscriber: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newIntakeSubscriber(t testing.TB, cfg rabbitmq.Config) *rabbitmq.Subscriber {
	s, err := rabbitmq.NewIntakeSubscriber(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new intake subscriber: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newInspector(t testing.TB, cfg rabbitmq.Config) *rabbitmq.Inspector {
	in, err := rabbitmq.NewInspector(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new inspector: %v", err)
	}
	t.Cleanup(func() { _ = in.Close() })
	return in
}

func driver(t *testing.T) brokertest.Driver {
	cfg := testConfig(t)
	return brokertest.Driver{
		NewPublisher:  func(t *testing.T) broker.Publisher { return newPublisher(t, cfg) },
		NewSubscriber: func(t *testing.T) broker.Subscriber { return newSubscriber(t, cfg) },
		NewIntakeSubscriber: func(t *testing.T) broker.Subscriber {
			return newIntakeSubscriber(t, cfg)
		},
		NewInspector:             func(t *testing.T) broker.Inspector { return newInspector(t, cfg) },
		DeadLetters:              func(t *testing.T) broker.DeadLetterReader { return newInspector(t, cfg) },
		BreakRetryPublishes:      breakRetries(cfg),
		BreakDeadLetterPublishes: breakDeadLetters(cfg),
		Features:                 brokertest.Features{ExactRedelivered: true, CompetingConsumers: true},
	}
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, driver)
}

type rabbitmqConfig = rabbitmq.Config

func newPublisherErr(cfg rabbitmq.Config) (*rabbitmq.Publisher, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return rabbitmq.NewPublisher(ctx, cfg)
}
