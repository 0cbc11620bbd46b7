package testsvc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"testing"

	"github.com/testcontainers/testcontainers-go"
	tcrabbitmq "github.com/testcontainers/testcontainers-go/modules/rabbitmq"
)

// EnvAMQPURL names the RabbitMQ the tests use.
const EnvAMQPURL = "LLMQ_TEST_AMQP_URL"

// rabbitImage is the container started when EnvAMQPURL is unset and a
// Docker engine answers.
const rabbitImage = "rabbitmq:3.13-management-alpine"

var rabbitContainer struct {
	once sync.Once
	url  string
	err  error
}

// AMQPURL returns the RabbitMQ URL from LLMQ_TEST_AMQP_URL, else starts a
// RabbitMQ container (shared by the test binary) when a Docker engine
// answers, else fails the test naming LLMQ_TEST_AMQP_URL. Tests isolate
// themselves with AMQPPrefix.
func AMQPURL(t testing.TB) string {
	t.Helper()
	if url := os.Getenv(EnvAMQPURL); url != "" {
		return url
	}
	if !dockerAnswers() {
		t.Fatalf("no RabbitMQ: set %s (e.g. amqp://guest:guest@127.0.0.1:5672/) or run a Docker engine", EnvAMQPURL)
	}
	rabbitContainer.once.Do(func() {
		ctx := context.Background()
		c, err := tcrabbitmq.Run(ctx, rabbitImage)
		if err != nil {
			rabbitContainer.err = err
			return
		}
		rabbitContainer.url, rabbitContainer.err = c.AmqpURL(ctx)
	})
	if rabbitContainer.err != nil {
		t.Fatalf("start RabbitMQ container (or set %s): %v", EnvAMQPURL, rabbitContainer.err)
	}
	return rabbitContainer.url
}

// AMQPPrefix returns a name prefix unique to this test ("test-<hex>.") for
// exchanges and queues, so tests share one broker in parallel.
func AMQPPrefix(t testing.TB) string { return uniquePrefix(t) }

func uniquePrefix(t testing.TB) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("random prefix: %v", err)
	}
	return "test-" + hex.EncodeToString(b[:]) + "."
}

// dockerAnswers reports whether a Docker engine is reachable (microseconds
// when none is).
func dockerAnswers() (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	p, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return false
	}
	defer p.Close()
	return p.Health(context.Background()) == nil
}
