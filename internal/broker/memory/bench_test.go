package memory_test

import (
	"testing"

	"github.com/llmq/llmq/internal/broker/brokertest"
	"github.com/llmq/llmq/internal/broker/memory"
)

func BenchmarkPublish(b *testing.B) {
	br := memory.New(memory.Config{})
	defer br.Close()
	brokertest.BenchPublish(b, br.Publisher(), 64)
}

func BenchmarkConsumeAck(b *testing.B) {
	br := memory.New(memory.Config{})
	defer br.Close()
	s := br.Subscriber()
	defer s.Close()
	brokertest.BenchConsume(b, br.Publisher(), s)
}
