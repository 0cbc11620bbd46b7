package client_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/leakcheck"
)

// The examples and the tests run against two llmq deployments started
// once for the test binary, each a real producer API and consumer (with
// llmsim in-process as the provider) on a Postgres database of its own:
// one on RabbitMQ (a vhost of its own), one on Kafka (an in-process kfake
// cluster). Both serve tenant "support" under apiKey and know one model,
// qwen-plus.
var (
	// apiURL is the API of the llmq on RabbitMQ, amqpURL its vhost.
	apiURL, amqpURL string
	// kafkaAPIURL is the API of the llmq on Kafka, kafkaBrokers its cluster.
	kafkaAPIURL  string
	kafkaBrokers []string
)

const apiKey = "key-support-0123456789"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(withDeployments{m}, leakcheck.LateCleanup()...)
}

// withDeployments runs the tests and examples with both deployments up.
type withDeployments struct{ m *testing.M }

func (w withDeployments) Run() (code int) {
	ctx, cancel := context.WithCancel(context.Background())
	var td teardown
	defer func() {
		cancel()
		if err := td.run(); err != nil {
			fmt.Fprintln(os.Stderr, "client tests: teardown:", err)
			code = 1
		}
	}()
	if err := startDeployments(ctx, &td); err != nil {
		fmt.Fprintln(os.Stderr, "client tests:", err)
		return 1
	}
	return w.m.Run()
}

func startDeployments(ctx context.Context, td *teardown) error {
	pg, err := newDatabase(ctx, td)
	if err != nil {
		return err
	}
	if amqpURL, err = newVhost(td); err != nil {
		return err
	}
	cfg, err := llmqConfig(pg, "rabbitmq", amqpURL, nil, "")
	if err != nil {
		return err
	}
	if apiURL, err = startLLMQ(ctx, td, cfg, true); err != nil {
		return fmt.Errorf("llmq on RabbitMQ: %w", err)
	}

	if pg, err = newDatabase(ctx, td); err != nil {
		return err
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return fmt.Errorf("start kfake: %w", err)
	}
	td.add(func() error { cluster.Close(); return nil })
	kafkaBrokers = cluster.ListenAddrs()
	if cfg, err = llmqConfig(pg, "kafka", "", kafkaBrokers, ""); err != nil {
		return err
	}
	if kafkaAPIURL, err = startLLMQ(ctx, td, cfg, true); err != nil {
		return fmt.Errorf("llmq on Kafka: %w", err)
	}
	return nil
}
