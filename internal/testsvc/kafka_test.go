package testsvc

import (
	"net"
	"testing"
)

func TestKafkaBrokersAnswer(t *testing.T) {
	brokers := KafkaBrokers(t)
	if len(brokers) == 0 {
		t.Fatal("no brokers")
	}
	c, err := net.Dial("tcp", brokers[0])
	if err != nil {
		t.Fatalf("dial %s: %v", brokers[0], err)
	}
	_ = c.Close()
}
