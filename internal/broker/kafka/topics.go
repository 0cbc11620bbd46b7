package kafka

import (
	"context"
	"errors"
	"fmt"

	kafkago "github.com/segmentio/kafka-go"
)

// newClient returns a client on its own transport; call done to close its
// connections (kafka-go's shared DefaultTransport would keep them forever).
func newClient(cfg Config) (client *kafkago.Client, done func()) {
	tr := &kafkago.Transport{}
	return &kafkago.Client{Addr: kafkago.TCP(cfg.Brokers...), Transport: tr}, tr.CloseIdleConnections
}

// ensureTopics creates the driver's topics that are missing.
func ensureTopics(ctx context.Context, cfg Config) error {
	req := &kafkago.CreateTopicsRequest{}
	for _, t := range cfg.topics() {
		req.Topics = append(req.Topics, kafkago.TopicConfig{
			Topic: t, NumPartitions: cfg.Partitions, ReplicationFactor: cfg.ReplicationFactor,
		})
	}
	client, done := newClient(cfg)
	defer done()
	resp, err := client.CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for topic, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", topic, err)
		}
	}
	return nil
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
