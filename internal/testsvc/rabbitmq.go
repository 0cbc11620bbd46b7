package testsvc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

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
		if err := amqpAnswers(url); err != nil {
			t.Fatalf("RabbitMQ of %s does not answer: %v; start it or point %s elsewhere", EnvAMQPURL, err, EnvAMQPURL)
		}
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

// amqpSeen records that the broker answered once in this test binary;
// later calls skip the probe, so a restart test that stops the broker on
// purpose is not failed by it.
var amqpSeen atomic.Bool

// amqpAnswers dials the broker's TCP port until it has answered once in
// this test binary. Without it a test against a broker that is down waits
// in the clients' reconnect loops until the package's timeout, and says
// nothing useful. Its errors name host and port, never the password.
func amqpAnswers(url string) error {
	if amqpSeen.Load() {
		return nil
	}
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return errors.New("not an AMQP URL")
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port)), 5*time.Second)
	if err != nil {
		return err
	}
	conn.Close()
	amqpSeen.Store(true)
	return nil
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
