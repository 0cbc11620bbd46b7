// Package rabbitmq is the RabbitMQ driver of the broker contract
// (amqp091-go). Topology, declared idempotently by every client at connect:
//
//	producers --> exchange <p>llmq.jobs (direct) --priority--> intake quorum queues
//	    <p>llmq.jobs.{high,normal,low}                  (consumed by the ingester)
//	ingester  --> exchange <p>llmq.lanes (direct) --priority--> lane quorum queues
//	    <p>llmq.lane.{high,normal,low}                  (consumed by the workers)
//	    both families: x-delivery-limit, x-overflow=reject-publish, optional
//	    x-max-length, dead-lettered at-least-once to <p>llmq.dlx
//	exchange <p>llmq.dlx (fanout) --> quorum queue <p>llmq.jobs.dead
//	exchange <p>llmq.delay (headers, llmq-retry-tier) --> quorum TTL queues
//	    <p>llmq.delay.{200ms,1s,5s,30s,2m,10m}, dead-lettered (keeping the
//	    priority routing key) to <p>llmq.lanes
//	exchange <p>llmq.status (fanout) for back-pressure status
//
// The intake queues keep the names, arguments and binding lane queues had
// before the intake existed, so a deployment's queues become its intake
// unchanged. The retry exchange of then (<p>llmq.retry, tier queues
// <p>llmq.retry.<tier> dead-lettering to <p>llmq.jobs) is no longer
// declared: a queue's arguments cannot change in place, and what is left in
// those queues flows on to the intake. DeleteTopology deletes it too.
//
// A delayed retry goes to the largest tier not above its delay with its due
// time in a header; a consumer that receives it before it is due re-tiers it
// instead of handing it out, so a waiting retry holds no consumer and never
// arrives early. Publishes wait for publisher confirms, pipelined on shared
// confirm channels; those carrying jobs are mandatory, so a publish that
// routes nowhere (a deleted queue) is an error, not a silent loss. Acks are
// coalesced: a run of consecutive delivery tags goes in one basic.ack with
// multiple=true, and an ack behind a delivery still in hand waits for it at
// most Config.AckDelay (Close sends waiting acks first). Every client
// reconnects by itself with backoff after a broker restart; subscriptions
// resume on the same Go channel.
package rabbitmq

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Config configures every client of the driver. Producers and consumers of
// one deployment must agree on DeliveryLimit, MaxLength and RetryTiers: the
// broker refuses to redeclare a queue with other arguments.
type Config struct {
	// URL is the AMQP URL (LLMQ_AMQP_URL). Never logged.
	URL string
	// Prefix is prepended to every exchange and queue name (tests isolate
	// themselves with it); empty means the contract's names.
	Prefix string
	// DeliveryLimit is the intake and lane queues' x-delivery-limit: after
	// that many redeliveries the broker dead-letters the message. Default 20.
	DeliveryLimit int
	// MaxLength, when > 0, caps each intake and each lane queue
	// (x-max-length); publishes past it are nacked and Publish and
	// PublishIntake return broker.ErrRejected.
	MaxLength int
	// RetryTiers are the delays of the delay (retry holding) queues,
	// ascending.
	// Default broker.DefaultRetryTiers.
	RetryTiers []time.Duration
	// PublishTimeout bounds one Publish including reconnects. Default 30s.
	PublishTimeout time.Duration
	// PublishChannels is the number of confirm channels publishes are spread
	// over. Default 2.
	PublishChannels int
	// AckDelay is the longest an ack waits to be coalesced with others when
	// deliveries are acked out of order (see consumeChan): the broker
	// re-delivers what was acked within the last AckDelay if the consumer
	// dies, and deferred acks hold up to half the prefetch. Default 100ms;
	// negative sends every ack at once.
	AckDelay time.Duration
	// ReconnectMin and ReconnectMax bound the reconnect backoff. Defaults
	// 100ms and 5s.
	ReconnectMin, ReconnectMax time.Duration
	// Heartbeat is the AMQP heartbeat. Default 10s.
	Heartbeat time.Duration
	// Logger receives reconnect warnings. Default discards.
	Logger *slog.Logger
}

// WithDefaults returns c with unset fields filled.
func (c Config) WithDefaults() Config {
	if c.DeliveryLimit <= 0 {
		c.DeliveryLimit = 20
	}
	if len(c.RetryTiers) == 0 {
		c.RetryTiers = broker.DefaultRetryTiers
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 30 * time.Second
	}
	if c.PublishChannels <= 0 {
		c.PublishChannels = 2
	}
	if c.AckDelay == 0 {
		c.AckDelay = 100 * time.Millisecond
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 100 * time.Millisecond
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = 5 * time.Second
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

func (c Config) validate() error {
	if c.URL == "" {
		return errors.New("rabbitmq: config: URL is required")
	}
	for i := 1; i < len(c.RetryTiers); i++ {
		if c.RetryTiers[i] <= c.RetryTiers[i-1] {
			return errors.New("rabbitmq: config: RetryTiers must be ascending")
		}
	}
	if c.RetryTiers[0] <= 0 {
		return errors.New("rabbitmq: config: RetryTiers must be positive")
	}
	return nil
}

// names derives every exchange and queue name from the prefix.
type names struct {
	prefix string
	// jobs is the public intake exchange, lanes the internal one.
	jobs, lanes, dlx, dead, delay, status string
	// results is the topic exchange of result events.
	results string
	// oldRetry is the delayed-retry exchange of earlier versions (its tier
	// queues dead-lettered to jobs); only DeleteTopology still names it.
	oldRetry string
}

func newNames(prefix string) names {
	return names{
		prefix:   prefix,
		jobs:     prefix + broker.JobsExchange,
		lanes:    prefix + broker.LanesExchange,
		dlx:      prefix + "llmq.dlx",
		dead:     prefix + broker.DeadLetterName,
		delay:    prefix + "llmq.delay",
		status:   prefix + broker.StatusName,
		results:  prefix + broker.ResultsName,
		oldRetry: prefix + "llmq.retry",
	}
}

// intake is the priority's intake queue, where producers' messages land.
func (n names) intake(l job.Priority) string { return n.prefix + broker.JobsTopicPrefix + string(l) }

// lane is the priority's internal lane queue, which the workers consume.
func (n names) lane(l job.Priority) string { return n.prefix + broker.LanePrefix + string(l) }

func (n names) tierQueue(d time.Duration) string { return n.delay + "." + tierName(d) }

func (n names) oldTierQueue(d time.Duration) string { return n.oldRetry + "." + tierName(d) }

// tierName spells a tier as 200ms, 5s or 2m.
func tierName(d time.Duration) string {
	switch {
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	default:
		return fmt.Sprintf("%dms", d/time.Millisecond)
	}
}
