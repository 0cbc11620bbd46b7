package broker

import (
	"context"
	"errors"
	"fmt"
)

// ResultsName is the RabbitMQ topic exchange and the Kafka topic of result
// events (docs/design.md#results).
const ResultsName = "llmq.results"

// ResultMessage is one result event to publish: on the results exchange
// (RabbitMQ, routing key RoutingKey) or topic (Kafka, key JobID), and on
// the job's own destination, if it named one.
type ResultMessage struct {
	EventID string
	// Type is the event's type (job.succeeded, …), the AMQP type property.
	Type       string
	Tenant     string
	JobID      string
	RoutingKey string
	Body       []byte
	// ReplyTo is a queue that also receives the event (RabbitMQ), with
	// CorrelationID as its correlation-id.
	ReplyTo       string
	CorrelationID string
	// Topic is a Kafka topic that also receives the event.
	Topic string
	// Slim, when set, encodes the event without the job's response, for
	// a broker that refuses Body for its size: readers of that copy fetch
	// the response by the job's id. SlimPublished, when set, is called once
	// a call published the event (not refused) with a slim copy among its
	// copies.
	Slim          func() ([]byte, error)
	SlimPublished func()
}

// ResultPublisher publishes result events.
type ResultPublisher interface {
	// PublishResults publishes every message and returns once all are
	// durable, or an error (then any of them may have been published: the
	// caller publishes them all again, and readers dedupe by EventID).
	// A destination that cannot exist for the driver (a reply queue on
	// Kafka, a result topic on RabbitMQ) is ignored. A reply queue that
	// does not exist loses only that copy: its index is returned in
	// unroutable, and the call still succeeds, since the consumer that
	// declared the queue is gone and waiting for it would hold every later
	// event back.
	//
	// When the broker took the call but refused some messages on their own
	// (RabbitMQ nacked one, a full reply queue with reject-publish; Kafka
	// refused one as too large, or its result topic could not be made),
	// the error is a *ResultsRefused naming them: the others are
	// published. A batch must not wait on one event the broker will not
	// take, or every later event of every tenant waits with it.
	PublishResults(ctx context.Context, msgs []ResultMessage) (unroutable []int, err error)
}

// ResultsRefused is PublishResults' error when the broker refused some
// messages on their own: Refused maps the index of each in msgs to why.
// Every other message was published.
type ResultsRefused struct {
	Refused map[int]error
}

// ErrOutOfTime, in ResultsRefused.Refused, marks an event the broker did
// not refuse but that the call had no time left to publish: it goes again
// later without counting as a refusal.
var ErrOutOfTime = errors.New("broker: no time left to publish the result event")

func (e *ResultsRefused) Error() string {
	for i, err := range e.Refused {
		return fmt.Sprintf("broker: %d result events refused (event %d: %v)", len(e.Refused), i, err)
	}
	return "broker: no result event refused"
}

// ResultAudience is a ResultPublisher that knows, before an event is read
// and encoded, that its routing key reaches nobody on the results exchange
// now (RabbitMQ: no queue bound, as the last probe found). The relay reads
// and encodes such an event only when it has a destination of its own
// (reply_to, result_topic, a webhook). A publisher without it is heard by
// every key (Kafka's topic keeps every event).
type ResultAudience interface {
	Unheard(routingKey string) bool
}
