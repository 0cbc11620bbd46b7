package client

import "context"

// Names of llmq's intake, where jobs are published (docs/design.md#names).
const (
	// IntakeExchange is the RabbitMQ exchange jobs are published to, with
	// the job's priority as routing key.
	IntakeExchange = "llmq.jobs"
	// IntakeTopicPrefix + priority is the Kafka topic jobs are published
	// to, with the job ID as message key.
	IntakeTopicPrefix = "llmq.jobs."
)

// Publisher publishes jobs to llmq's intake. A nil error means the broker
// holds the job durably; llmq's ingester then stores it (and the API knows
// it) within moments. Publishing the same job again is harmless: the
// ingester stores a job ID once (a different job under an ID the tenant
// already used is refused as a dead letter). Both implementations, *AMQPPublisher and
// *KafkaPublisher, are safe for concurrent use, and publishes in flight at
// once share the broker's round trips.
//
// Publish first checks the job cheaply — id present and well-formed,
// tenant, model, priority, request and metadata objects — and refuses a
// job that breaks a rule with a *ValidationError naming the field. Broker
// failures are a *PublishError (see IsRetryable).
type Publisher interface {
	Publish(ctx context.Context, j Job) error
	// Close releases the publisher's connections; call it once the
	// publishes in flight have returned.
	Close() error
}

var (
	_ Publisher = (*AMQPPublisher)(nil)
	_ Publisher = (*KafkaPublisher)(nil)
)

// prepare validates j and encodes it for a queue.
func prepare(j *Job) ([]byte, error) {
	if err := j.validate(); err != nil {
		return nil, err
	}
	return j.encode()
}
