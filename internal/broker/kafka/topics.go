package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	kafkago "github.com/segmentio/kafka-go"
)

// newClient returns a client on its own transport; call done to close its
// connections (kafka-go's shared DefaultTransport would keep them forever).
func newClient(cfg Config) (client *kafkago.Client, done func()) {
	tr := newTransport(cfg)
	return &kafkago.Client{Addr: kafkago.TCP(cfg.Brokers...), Transport: tr}, tr.CloseIdleConnections
}

// topicConfig is how the driver creates a topic.
func (c Config) topicConfig(topic string) kafkago.TopicConfig {
	tc := kafkago.TopicConfig{Topic: topic, NumPartitions: c.Partitions, ReplicationFactor: c.ReplicationFactor}
	if c.MinInsyncReplicas > 0 {
		tc.ConfigEntries = append(tc.ConfigEntries, kafkago.ConfigEntry{ConfigName: "min.insync.replicas", ConfigValue: strconv.Itoa(c.MinInsyncReplicas)})
	}
	if topic == c.deadTopic() && c.DeadRetention > 0 {
		tc.ConfigEntries = append(tc.ConfigEntries, kafkago.ConfigEntry{ConfigName: "retention.ms", ConfigValue: strconv.FormatInt(c.DeadRetention.Milliseconds(), 10)})
	}
	return tc
}

// ensureTopics creates the driver's topics that are missing and checks
// the ones that exist against the configured durability (checkTopics).
func ensureTopics(ctx context.Context, cfg Config) error {
	req := &kafkago.CreateTopicsRequest{}
	for _, t := range cfg.topics() {
		req.Topics = append(req.Topics, cfg.topicConfig(t))
	}
	client, done := newClient(cfg)
	defer done()
	// kafka-go reports a failed TLS or SASL handshake on an admin request
	// as "Broker Not Available"; a metadata request first surfaces it.
	if _, err := client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{}}); err != nil {
		if cfg.TLS != nil || cfg.SASL != nil {
			// A wrong password or certificate looks like a dropped connection.
			return fmt.Errorf("connect to %v (check kafka.tls and kafka.sasl credentials): %w", cfg.Brokers, err)
		}
		return fmt.Errorf("connect to %v: %w", cfg.Brokers, err)
	}
	resp, err := client.CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for topic, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", topic, err)
		}
	}
	return checkTopics(ctx, client, cfg, cfg.topics())
}

// DeleteTopics deletes every topic under cfg.Prefix; topics that do not
// exist are skipped. For tests and teardown of scratch environments.
func DeleteTopics(ctx context.Context, cfg Config) error {
	cfg = cfg.WithDefaults()
	client, done := newClient(cfg)
	defer done()
	resp, err := client.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: cfg.topics()})
	if err != nil {
		return fmt.Errorf("delete topics: %w", err)
	}
	for topic, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafkago.UnknownTopicOrPartition) {
			return fmt.Errorf("delete topic %s: %w", topic, err)
		}
	}
	return nil
}
