package testsvc

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestAMQPURLConnects(t *testing.T) {
	url := AMQPURL(t)
	// Another package's test may be restarting the shared broker
	// (LLMQ_TEST_ALLOW_RESTART): wait for it with a deadline.
	deadline := time.Now().Add(90 * time.Second)
	retry := time.NewTicker(200 * time.Millisecond)
	defer retry.Stop()
	for {
		conn, err := amqp.Dial(url)
		if err == nil {
			_ = conn.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial %s: %v", EnvAMQPURL, err)
		}
		<-retry.C
	}
}

func TestPrefixesAreUnique(t *testing.T) {
	a, b := AMQPPrefix(t), KafkaPrefix(t)
	if a == b || !strings.HasPrefix(a, "test-") || !strings.HasSuffix(a, ".") {
		t.Fatalf("prefixes %q %q", a, b)
	}
}
