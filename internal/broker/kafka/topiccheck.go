package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	kafkago "github.com/segmentio/kafka-go"
)

// topicState is what the cluster says of one existing topic.
type topicState struct {
	partitions int
	// replicas is the smallest replica count of any partition: the copies
	// the weakest partition keeps.
	replicas int
	// minInsync is the topic's effective min.insync.replicas (0: unknown).
	minInsync int
}

// checkTopics compares the topics as they exist with the configured
// durability. A topic created before (by an older llmq, an operator, the
// broker's auto-creation) keeps its settings, so a configured replication
// factor would otherwise be silently absent: a replication factor below
// the configured one, or a min.insync.replicas above the topic's replica
// count (every acks=all publish would fail), fails start; a partition
// count that differs only warns, since it changes parallelism, not safety.
func checkTopics(ctx context.Context, client *kafkago.Client, cfg Config, topics []string) error {
	states, err := describeTopics(ctx, client, topics)
	if err != nil {
		return fmt.Errorf("check topics: %w", err)
	}
	var errs []error
	for _, t := range topics {
		st, ok := states[t]
		if !ok {
			// Just created and not yet propagated to the broker asked:
			// it has the configured settings.
			continue
		}
		if st.replicas < cfg.ReplicationFactor {
			errs = append(errs, fmt.Errorf("topic %s has replication factor %d, below the configured %d (kafka.replication_factor); raise it with kafka-reassign-partitions or lower the setting",
				t, st.replicas, cfg.ReplicationFactor))
		}
		if st.minInsync > st.replicas {
			errs = append(errs, fmt.Errorf("topic %s has min.insync.replicas %d above its replication factor %d: no acks=all publish can succeed",
				t, st.minInsync, st.replicas))
		}
		if st.partitions != cfg.Partitions {
			cfg.Logger.Warn("kafka topic partitions differ from kafka.partitions", "topic", t,
				"partitions", st.partitions, "configured", cfg.Partitions)
		}
		if cfg.MinInsyncReplicas > 0 && st.minInsync != cfg.MinInsyncReplicas {
			cfg.Logger.Warn("kafka topic min.insync.replicas differs from kafka.min_insync_replicas", "topic", t,
				"min_insync_replicas", st.minInsync, "configured", cfg.MinInsyncReplicas)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("check topics: %w", errors.Join(errs...))
	}
	return nil
}

// describeTopics reads the partitions, replicas and min.insync.replicas of
// topics.
func describeTopics(ctx context.Context, client *kafkago.Client, topics []string) (map[string]topicState, error) {
	meta, err := client.Metadata(ctx, &kafkago.MetadataRequest{Topics: topics})
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	out := make(map[string]topicState, len(topics))
	for _, t := range meta.Topics {
		if errors.Is(t.Error, kafkago.UnknownTopicOrPartition) || errors.Is(t.Error, kafkago.LeaderNotAvailable) {
			continue // not propagated yet
		}
		if t.Error != nil {
			return nil, fmt.Errorf("metadata of %s: %w", t.Name, t.Error)
		}
		st := topicState{partitions: len(t.Partitions)}
		for i, p := range t.Partitions {
			if i == 0 || len(p.Replicas) < st.replicas {
				st.replicas = len(p.Replicas)
			}
		}
		out[t.Name] = st
	}
	req := &kafkago.DescribeConfigsRequest{}
	for _, t := range topics {
		req.Resources = append(req.Resources, kafkago.DescribeConfigRequestResource{
			ResourceType: kafkago.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{"min.insync.replicas"},
		})
	}
	resp, err := client.DescribeConfigs(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("describe configs: %w", err)
	}
	for _, r := range resp.Resources {
		st, ok := out[r.ResourceName]
		if !ok {
			continue
		}
		if r.Error != nil {
			return nil, fmt.Errorf("describe configs of %s: %w", r.ResourceName, r.Error)
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName == "min.insync.replicas" {
				n, err := strconv.Atoi(e.ConfigValue)
				if err != nil {
					return nil, fmt.Errorf("min.insync.replicas of %s: %q is not a number", r.ResourceName, e.ConfigValue)
				}
				st.minInsync = n
			}
		}
		out[r.ResourceName] = st
	}
	return out, nil
}
