package client_test

import (
	"testing"

	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/job"
)

// The Kafka publisher authenticates with SASL when told to, and its job
// arrives on llmq's intake.
func TestKafkaPublisherSASL(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	const pass = "producer-password-0123"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "producer", pass))
	require.NoError(t, err)
	t.Cleanup(c.Close)

	m, err := scram.Mechanism(scram.SHA256, "producer", pass)
	require.NoError(t, err)
	cfg := kafka.Config{Brokers: c.ListenAddrs(), SASL: m}
	intake, err := kafka.NewIntakeSubscriber(ctx, cfg) // creates llmq's topics
	require.NoError(t, err)
	t.Cleanup(func() { _ = intake.Close() })

	pub, err := client.NewKafkaPublisher(c.ListenAddrs(), client.WithKafkaSASL(m))
	require.NoError(t, err)
	defer func() { require.NoError(t, pub.Close()) }()
	require.NoError(t, pub.Publish(ctx, client.Job{ID: "sasl-1", Model: "qwen-plus", Request: chatRequest("x")}))

	ch, err := intake.Subscribe(ctx, job.PriorityNormal, 1)
	require.NoError(t, err)
	select {
	case d := <-ch:
		assert.Equal(t, "sasl-1", d.Message().Key)
		require.NoError(t, d.Ack(ctx))
	case <-ctx.Done():
		t.Fatal("the job never arrived")
	}
}
