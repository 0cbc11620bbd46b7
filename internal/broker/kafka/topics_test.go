package kafka_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/testsvc"
)

// syncBuffer is a log sink safe for the driver's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// threeBrokers is a kfake cluster that can hold three replicas.
func threeBrokers(t *testing.T) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// createTopic creates topic as an operator (or an older llmq) would have.
func createTopic(t *testing.T, brokers []string, tc kafkago.TopicConfig) {
	t.Helper()
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr}
	resp, err := client.CreateTopics(context.Background(), &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{tc}})
	require.NoError(t, err)
	require.NoError(t, resp.Errors[tc.Topic])
}

// describe returns a topic's partition count, replicas of its first
// partition and min.insync.replicas.
func describe(t *testing.T, brokers []string, topic string) (partitions, replicas int, minInsync string) {
	t.Helper()
	partitions, replicas, cfg := describeConfig(t, brokers, topic, "min.insync.replicas")
	return partitions, replicas, cfg
}

// describeConfig is describe for any one topic config.
func describeConfig(t *testing.T, brokers []string, topic, name string) (partitions, replicas int, value string) {
	t.Helper()
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr}
	meta, err := client.Metadata(context.Background(), &kafkago.MetadataRequest{Topics: []string{topic}})
	require.NoError(t, err)
	require.Len(t, meta.Topics, 1)
	require.NotEmpty(t, meta.Topics[0].Partitions)
	cfgs, err := client.DescribeConfigs(context.Background(), &kafkago.DescribeConfigsRequest{Resources: []kafkago.DescribeConfigRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{name}}}})
	require.NoError(t, err)
	for _, r := range cfgs.Resources {
		for _, e := range r.ConfigEntries {
			if e.ConfigName == name {
				value = e.ConfigValue
			}
		}
	}
	return len(meta.Topics[0].Partitions), len(meta.Topics[0].Partitions[0].Replicas), value
}

// Topics llmq creates have the configured partitions, replicas and
// min.insync.replicas.
func TestTopicsCreatedAsConfigured(t *testing.T) {
	t.Parallel()
	brokers := threeBrokers(t)
	cfg := kafka.Config{Brokers: brokers, Prefix: testsvc.KafkaPrefix(t), Partitions: 5, ReplicationFactor: 3, MinInsyncReplicas: 2}
	newPublisher(t, cfg)
	for _, topic := range []string{cfg.Prefix + broker.LanePrefix + "high", cfg.Prefix + broker.DeadLetterTopic} {
		parts, replicas, minInsync := describe(t, brokers, topic)
		assert.Equal(t, 5, parts, topic)
		assert.Equal(t, 3, replicas, topic)
		assert.Equal(t, "2", minInsync, topic)
	}
	// A second start finds them as configured: no error.
	newSubscriber(t, cfg)
}

// The dead-letter topic llmq creates keeps its messages for DeadRetention
// (retention.dead), the other topics the broker's default.
func TestDeadTopicRetention(t *testing.T) {
	t.Parallel()
	brokers := threeBrokers(t)
	cfg := kafka.Config{Brokers: brokers, Prefix: testsvc.KafkaPrefix(t), DeadRetention: 30 * 24 * time.Hour}
	newPublisher(t, cfg)
	_, _, dead := describeConfig(t, brokers, cfg.Prefix+broker.DeadLetterTopic, "retention.ms")
	assert.Equal(t, "2592000000", dead)
	_, _, lane := describeConfig(t, brokers, cfg.Prefix+broker.LanePrefix+"normal", "retention.ms")
	assert.NotEqual(t, "2592000000", lane)
}

// Existing topics are checked at start: fewer replicas than configured or
// a min.insync.replicas above the replicas fail it, naming the topic;
// other partitions only warn.
func TestExistingTopicsChecked(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Run("replication factor below the configured one", func(t *testing.T) {
		brokers := threeBrokers(t)
		cfg := kafka.Config{Brokers: brokers, Prefix: testsvc.KafkaPrefix(t), ReplicationFactor: 3}
		lane := cfg.Prefix + broker.LanePrefix + "normal"
		createTopic(t, brokers, kafkago.TopicConfig{Topic: lane, NumPartitions: 3, ReplicationFactor: 1})
		_, err := kafka.NewPublisher(ctx, cfg)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "topic "+lane+" has replication factor 1, below the configured 3")
		_, err = kafka.NewSubscriber(ctx, cfg)
		assert.ErrorContains(t, err, lane)
	})
	t.Run("min.insync.replicas above the replicas", func(t *testing.T) {
		brokers := threeBrokers(t)
		cfg := kafka.Config{Brokers: brokers, Prefix: testsvc.KafkaPrefix(t), ReplicationFactor: 2}
		dlq := cfg.Prefix + broker.DeadLetterTopic
		createTopic(t, brokers, kafkago.TopicConfig{Topic: dlq, NumPartitions: 3, ReplicationFactor: 2,
			ConfigEntries: []kafkago.ConfigEntry{{ConfigName: "min.insync.replicas", ConfigValue: "3"}}})
		_, err := kafka.NewInspector(ctx, cfg)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "topic "+dlq+" has min.insync.replicas 3 above its replication factor 2")
	})
	t.Run("other partitions warn", func(t *testing.T) {
		brokers := threeBrokers(t)
		var logs syncBuffer
		cfg := kafka.Config{Brokers: brokers, Prefix: testsvc.KafkaPrefix(t),
			Logger: slog.New(slog.NewTextHandler(&logs, nil))}
		retry := cfg.Prefix + "llmq.jobs.retry"
		createTopic(t, brokers, kafkago.TopicConfig{Topic: retry, NumPartitions: 1, ReplicationFactor: 1})
		newPublisher(t, cfg)
		assert.Contains(t, logs.String(), "topic="+retry+" partitions=1 configured=3")
	})
	t.Run("config refuses min.insync above replication", func(t *testing.T) {
		_, err := kafka.NewPublisher(ctx, kafka.Config{Brokers: []string{"127.0.0.1:1"}, ReplicationFactor: 1, MinInsyncReplicas: 2})
		assert.ErrorContains(t, err, "MinInsyncReplicas 2 exceeds ReplicationFactor 1")
	})
}
