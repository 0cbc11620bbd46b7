package testsvc

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestAMQPURLConnects(t *testing.T) {
	conn, err := amqp.Dial(AMQPURL(t))
	if err != nil {
		t.Fatalf("dial %s: %v", EnvAMQPURL, err)
	}
	_ = conn.Close()
}

func TestPrefixesAreUnique(t *testing.T) {
	a, b := AMQPPrefix(t), KafkaPrefix(t)
	if a == b || !strings.HasPrefix(a, "test-") || !strings.HasSuffix(a, ".") {
		t.Fatalf("prefixes %q %q", a, b)
	}
}
