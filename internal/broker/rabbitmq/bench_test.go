package rabbitmq_test

import (
	"testing"

	"github.com/llmq/llmq/internal/broker/brokertest"
)

func BenchmarkPublishConfirm(b *testing.B) {
	cfg := testConfig(b)
	brokertest.BenchPublish(b, newPublisher(b, cfg), 64)
}

func BenchmarkConsumeAck(b *testing.B) {
	cfg := testConfig(b)
	brokertest.BenchConsume(b, newPublisher(b, cfg), newSubscriber(b, cfg))
}
