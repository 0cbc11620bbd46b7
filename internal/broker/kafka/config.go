// Package kafka is the Kafka driver of the broker contract (segmentio/kafka-go).
//
// Topics (created at start when missing): the intake <p>llmq.jobs.{high,normal,low},
// where producers publish (message key = job ID), and beside it each
// Config.TenantTopics tenant's own <p>llmq.jobs.<priority>.<tenant>, the internal lanes
// <p>llmq.lane.{high,normal,low} the workers consume, <p>llmq.jobs.retry,
// <p>llmq.jobs.dlq and <p>llmq.status. Each intake topic is consumed by its
// own consumer group <p><GroupID>.<priority> (the lanes' groups before the
// intake existed, so an upgrade carries on where they committed) and each
// lane by <p><GroupID>.lane.<priority>; Depth is the lag of both.
//
// Within a partition messages are processed concurrently (up to prefetch per
// subscription); an offset tracker per partition commits only up to the
// lowest unfinished offset, so neither a crash nor a rebalance ever commits
// work that is not done (it may redeliver work that is).
//
// Nack re-publishes the message to its own topic (header
// x-llmq-redelivered) and then marks it done; Redelivered is therefore
// exact after a Nack but approximate otherwise: a message re-read after a
// crash or rebalance is not flagged. Retry with a delay publishes to the
// retry topic with a due-time header; a forwarder run by every lane
// Subscriber (its own consumer group) holds due times on timers, not on a
// partition, re-publishes each message to its lane when due, and commits
// retry offsets the same lowest-unfinished way. A settlement whose publish
// fails keeps retrying it in the background (see Subscriber.republish).
package kafka

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go/sasl"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Config configures every client of the driver.
type Config struct {
	// Brokers are the bootstrap brokers (LLMQ_KAFKA_BROKERS).
	Brokers []string
	// Prefix is prepended to every topic and group name (tests isolate
	// themselves with it); empty means the contract's names.
	Prefix string
	// GroupID names the consumer groups. Default "llmq-consumer".
	GroupID string
	// Partitions and ReplicationFactor apply to topics created at start
	// and are checked on those that exist (topics.go). Defaults 3 and 1.
	Partitions        int
	ReplicationFactor int
	// MinInsyncReplicas, when positive, is the min.insync.replicas of
	// topics created at start; with acks=all it is how many copies a
	// publish has when it returns. Zero leaves the broker's default.
	MinInsyncReplicas int
	// DeadRetention, when positive, is the retention.ms of the dead-letter
	// topic when llmq creates it: a backstop for a DLQ that no reconciler
	// drains (llmq sets retention.dead). An existing topic is left as it is.
	DeadRetention time.Duration
	// TLS, when set, encrypts every connection the driver makes (and may
	// carry a client certificate); see TLSConfig.
	TLS *tls.Config
	// SASL, when set, authenticates every connection; see SASL.
	SASL sasl.Mechanism
	// BatchTimeout is the writer's linger; kafka-go's default of 1s would
	// hold every single publish for a second. Default 2ms.
	BatchTimeout time.Duration
	// MaxPendingRetries bounds the delayed retries a forwarder holds on
	// timers; past it, it stops reading the retry topic. Default 100000.
	MaxPendingRetries int
	// SessionTimeout of the consumer groups. Default 10s.
	SessionTimeout time.Duration
	// TenantTopics are the tenants that have intake topics of their own,
	// <p>llmq.jobs.<priority>.<tenant>, each consumed by the intake
	// subscriber beside the shared intake in its own consumer group
	// <p><GroupID>.<priority>.tenant.<tenant>: the tenants with broker_users.
	// Kafka records carry no identity the broker checks, so the topic is
	// the identity: its ACLs let only the tenant's principals write it, and
	// every delivery from it has broker.Message.IntakeTenant set
	// (docs/design.md#broker-identity).
	TenantTopics []string
	// Logger receives warnings. Default discards.
	Logger *slog.Logger
}

// WithDefaults returns c with unset fields filled.
func (c Config) WithDefaults() Config {
	if c.GroupID == "" {
		c.GroupID = "llmq-consumer"
	}
	if c.Partitions <= 0 {
		c.Partitions = 3
	}
	if c.ReplicationFactor <= 0 {
		c.ReplicationFactor = 1
	}
	if c.BatchTimeout <= 0 {
		c.BatchTimeout = 2 * time.Millisecond
	}
	if c.MaxPendingRetries <= 0 {
		c.MaxPendingRetries = 100000
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

func (c Config) validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("kafka: config: Brokers is required")
	}
	if c.MinInsyncReplicas > c.ReplicationFactor {
		return fmt.Errorf("kafka: config: MinInsyncReplicas %d exceeds ReplicationFactor %d: no publish could ever be acknowledged", c.MinInsyncReplicas, c.ReplicationFactor)
	}
	return nil
}

// intakeTopic is the priority's public intake topic.
func (c Config) intakeTopic(l job.Priority) string {
	return c.Prefix + broker.JobsTopicPrefix + string(l)
}

// tenantTopic is the priority's intake topic of one tenant.
func (c Config) tenantTopic(l job.Priority, tenant string) string {
	return c.intakeTopic(l) + "." + tenant
}

// intakeSource is one topic the intake subscriber reads for a priority.
type intakeSource struct {
	topic, group string
	tenant       string // the tenant whose own topic it is; "" for the shared one
}

// intakeSources are the priority's shared intake topic and its tenants'.
func (c Config) intakeSources(l job.Priority) []intakeSource {
	out := []intakeSource{{topic: c.intakeTopic(l), group: c.intakeGroup(l)}}
	for _, t := range c.TenantTopics {
		out = append(out, intakeSource{topic: c.tenantTopic(l, t), group: c.intakeGroup(l) + ".tenant." + t, tenant: t})
	}
	return out
}

// laneTopic is the priority's internal lane topic.
func (c Config) laneTopic(l job.Priority) string {
	return c.Prefix + broker.LanePrefix + string(l)
}
func (c Config) retryTopic() string  { return c.Prefix + broker.JobsTopicPrefix + "retry" }
func (c Config) deadTopic() string   { return c.Prefix + broker.DeadLetterTopic }
func (c Config) statusTopic() string { return c.Prefix + broker.StatusName }

// ResultsTopic is the topic of result events (keyed by job id).
func (c Config) ResultsTopic() string { return c.Prefix + broker.ResultsName }
func (c Config) intakeGroup(l job.Priority) string {
	return c.Prefix + c.GroupID + "." + string(l)
}
func (c Config) laneGroup(l job.Priority) string {
	return c.Prefix + c.GroupID + ".lane." + string(l)
}
func (c Config) retryGroup() string { return c.Prefix + c.GroupID + ".retry" }
func (c Config) deadGroup() string  { return c.Prefix + c.GroupID + ".dlq-reader" }

// topics are every topic the driver uses.
func (c Config) topics() []string {
	topics := []string{c.retryTopic(), c.deadTopic(), c.statusTopic(), c.ResultsTopic()}
	for _, l := range job.Priorities {
		topics = append(topics, c.laneTopic(l))
		for _, src := range c.intakeSources(l) {
			topics = append(topics, src.topic)
		}
	}
	return topics
}

// headerLane names the lane a message in the retry topic returns to.
const headerLane = "x-llmq-lane"
