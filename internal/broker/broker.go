// Package broker is the seam between llmq and its message brokers. It owns
// the contract (this file) that every driver — rabbitmq, kafka and the
// in-memory one — implements, and the conformance suite that proves it.
//
// Every driver has two families of queues (topics) per priority: the public
// intake, where producers publish (exchange llmq.jobs, Kafka topics
// llmq.jobs.<priority>), and the internal lanes the workers consume
// (llmq.lane.<priority>). The ingester consumes the intake, records each job
// and forwards it to its lane (Publish) before it acks.
//
// Guarantees every driver gives:
//   - Publish and PublishIntake return nil only once the broker has made the
//     message durable (publisher confirm / acks=all); any other outcome is
//     an error.
//   - A delivery is settled exactly once, by Ack, Nack, Retry or DeadLetter;
//     a second settlement returns ErrSettled.
//   - Retry and DeadLetter make the new message durable before they settle
//     the original, so a crash in between duplicates and never loses.
//   - A settlement whose publish fails (Retry, DeadLetter, and Kafka's Nack,
//     which re-publishes) never leaves the delivery unsettled, which would
//     stall the prefetch (RabbitMQ) or the commit point (Kafka): the
//     delivery is handed back and the call returns an error wrapping
//     ErrHandedBack; it counts as settled. RabbitMQ and memory return the
//     message to its queue at once (redelivered); Kafka keeps retrying that
//     publish in the background, holding the prefetch slot and the offset,
//     and commits the offset once it succeeds (if the subscriber closes
//     first, the offset stays uncommitted and the message is read again).
//   - A message handed back (Nack with requeue, a lost connection, a
//     consumer that stops) is delivered again, possibly to another consumer.
//   - Subscribe's channel survives reconnects; it closes when ctx ends or the
//     subscriber is closed. After ctx ends no new delivery is handed out, but
//     deliveries already handed out can still be settled until Close (a
//     clean drain); Close hands every unsettled delivery back to the broker,
//     and settling one afterwards returns an error.
package broker

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/llmq/llmq/internal/job"
)

// Names shared by every driver (docs/design.md#names).
const (
	// JobsExchange is the public intake: the RabbitMQ exchange producers
	// publish to (routing key = priority), bound to the intake queues
	// JobsTopicPrefix+priority; Kafka's intake topics are
	// JobsTopicPrefix+priority.
	JobsExchange    = "llmq.jobs"
	JobsTopicPrefix = "llmq.jobs."
	// LanesExchange is the internal RabbitMQ exchange of the lanes the
	// workers consume (routing key = priority), bound to the lane queues
	// LanePrefix+priority; Kafka's lane topics are LanePrefix+priority.
	LanesExchange   = "llmq.lanes"
	LanePrefix      = "llmq.lane."
	DeadLetterName  = "llmq.jobs.dead" // RabbitMQ DLQ; Kafka uses DeadLetterTopic
	DeadLetterTopic = "llmq.jobs.dlq"
	StatusName      = "llmq.status"
)

// Errors callers branch on.
var (
	ErrSettled = errors.New("broker: delivery already settled")
	ErrClosed  = errors.New("broker: closed")
	// ErrRejected means the broker refused a publish (RabbitMQ nack, e.g.
	// x-max-length with reject-publish): back-pressure, not a fault.
	ErrRejected = errors.New("broker: publish rejected by broker")
	// ErrHandedBack means a settlement could not publish what it had to
	// (Retry, DeadLetter, Kafka's Nack) and handed the delivery back
	// instead: it is settled, and the message will be seen again (see the
	// package guarantees). Retry on an intake delivery returns it too.
	ErrHandedBack = errors.New("broker: settlement failed, delivery handed back")
)

// Message is what producers publish: a job body and its key.
type Message struct {
	// Key is the job ID: the Kafka message key and the AMQP message-id.
	Key string
	// Body is the job JSON, byte for byte as the producer sent it.
	Body []byte
	// Headers carry llmq metadata (tenant, retry count, …); may be nil.
	Headers map[string]string
	// ReplyTo and CorrelationID are the AMQP properties of the same names
	// on a RabbitMQ intake message: where the job's result event goes
	// (docs/design.md#results). Kafka has no such properties.
	ReplyTo, CorrelationID string
	// UserID is the AMQP user_id property of a RabbitMQ intake message,
	// which the broker checks against the publishing connection's user: an
	// identity the publisher cannot forge (docs/design.md#broker-identity).
	// Empty when the publisher did not set it; Kafka has none.
	UserID string
	// IntakeTenant is the tenant whose own intake topic (Kafka
	// llmq.jobs.<priority>.<tenant>, writable only by that tenant's
	// principals under the topic ACLs) carried the message; empty on the
	// shared intake and on RabbitMQ.
	IntakeTenant string
}

// WakeUp is the lane message of a stored job: its key and model and
// nothing else. A worker claims the job's row by that key and runs the
// stored job, so the job's body would only cost the lanes bytes (the broker
// logs, replicates and delivers every one of them); the model lets a worker
// keep tenants fair before it claims (docs/design.md#tenants). model may be
// empty when the publisher does not know it.
func WakeUp(key job.Key, model string) Message {
	return wakeUp(LaneNote{Key: key, Model: model})
}

// Unparked is the lane message of a parked job published again: a worker
// takes it even when it already holds the tenant's share, so a job is
// parked at most once per publish it is given.
func Unparked(key job.Key, model string) Message {
	return wakeUp(LaneNote{Key: key, Model: model, Unparked: true})
}

// LaneNote is what a lane message says.
type LaneNote struct {
	Key      job.Key
	Model    string
	Unparked bool
}

type laneBody struct {
	ID       string `json:"id"`
	Tenant   string `json:"tenant"`
	Model    string `json:"model,omitempty"`
	Unparked bool   `json:"unparked,omitempty"`
}

func wakeUp(n LaneNote) Message {
	body, _ := json.Marshal(laneBody{n.Key.ID, n.Key.Tenant, n.Model, n.Unparked})
	return Message{Key: n.Key.ID, Body: body, Headers: map[string]string{"tenant": n.Key.Tenant}}
}

// ReadLaneNote decodes a lane message.
func ReadLaneNote(body []byte) (LaneNote, error) {
	key, err := job.ReadKey(body)
	if err != nil {
		return LaneNote{}, err
	}
	var b laneBody
	_ = json.Unmarshal(body, &b) // ReadKey has parsed it already
	return LaneNote{Key: key, Model: b.Model, Unparked: b.Unparked}, nil
}

type ackNowKey struct{}

// AckNow marks ctx so that an Ack under it is sent at once by a driver
// that otherwise defers acks to coalesce them (RabbitMQ): the caller acks
// to free the prefetch slot now, as a consumer parking a job does.
func AckNow(ctx context.Context) context.Context { return context.WithValue(ctx, ackNowKey{}, true) }

// IsAckNow reports whether ctx was marked by AckNow.
func IsAckNow(ctx context.Context) bool { v, _ := ctx.Value(ackNowKey{}).(bool); return v }

// Publisher puts messages on lanes and on the intake.
type Publisher interface {
	// Publish sends msg to the internal lane the workers consume and returns
	// once it is durable.
	Publish(ctx context.Context, lane job.Priority, msg Message) error
	// PublishIntake sends msg to the public intake of the lane's priority,
	// where producers publish, with the same guarantee as Publish
	// (ErrRejected when the broker refuses it for back-pressure).
	PublishIntake(ctx context.Context, lane job.Priority, msg Message) error
	// PublishStatus broadcasts a back-pressure status document on llmq.status.
	PublishStatus(ctx context.Context, body []byte) error
	Close() error
}

// DeadLetter is the envelope of a message that will not be processed.
type DeadLetter struct {
	Body          []byte       `json:"body"` // the original body byte for byte (base64 in JSON)
	Key           string       `json:"key,omitempty"`
	Reason        string       `json:"reason"`
	Attempts      int          `json:"attempts"`
	LastError     string       `json:"last_error,omitempty"`
	FirstFailedAt time.Time    `json:"first_failed_at"`
	LastFailedAt  time.Time    `json:"last_failed_at"`
	Lane          job.Priority `json:"lane"`
	// FromIntake is true when the message died on the intake rather than on
	// a lane: dead-lettered by the broker from an intake queue (RabbitMQ's
	// x-delivery-limit) or by DeadLetter on an intake delivery.
	FromIntake bool `json:"from_intake,omitempty"`
	// UserID is the dead message's Message.UserID: RabbitMQ keeps the
	// user_id it checked at the publish when it dead-letters a message by
	// itself. Never written into an envelope, whose fields nothing
	// checked: the reconciler judges an intake message's tenant by it.
	UserID string `json:"-"`
}

// Filled returns dl with an empty Body, Key, Lane and UserID taken from
// the delivered message msg of lane, and FromIntake set when it was
// delivered from the intake: what every driver's DeadLetter fills in.
func (dl DeadLetter) Filled(msg Message, lane job.Priority, fromIntake bool) DeadLetter {
	if dl.Body == nil {
		dl.Body = msg.Body
	}
	if dl.Key == "" {
		dl.Key = msg.Key
	}
	if dl.Lane == "" {
		dl.Lane = lane
	}
	dl.FromIntake = dl.FromIntake || fromIntake
	if dl.UserID == "" {
		dl.UserID = msg.UserID
	}
	return dl
}

// Delivery is one received message, to be settled exactly once.
type Delivery interface {
	Message() Message
	Lane() job.Priority
	// Redelivered reports whether the broker may have delivered it before.
	Redelivered() bool
	// Ack settles the message as done.
	Ack(ctx context.Context) error
	// Nack hands the message back for immediate redelivery.
	Nack(ctx context.Context) error
	// Retry re-publishes the message (with extra headers merged in) so it is
	// delivered again on the same lane no earlier than delay from now,
	// holding no consumer meanwhile, then settles this delivery. An intake
	// delivery cannot be retried: Retry hands it back and returns an error
	// wrapping ErrHandedBack.
	Retry(ctx context.Context, delay time.Duration, headers map[string]string) error
	// DeadLetter publishes the envelope to the dead-letter queue, then
	// settles this delivery. Empty Body, Key and Lane are filled from the
	// delivery; FromIntake is set on an intake delivery. An envelope that
	// cannot be encoded is an error that leaves the delivery unsettled.
	DeadLetter(ctx context.Context, dl DeadLetter) error
}

// Subscriber receives messages from lanes (the workers' subscriber) or from
// the intake (the ingester's); each driver has a constructor for each.
type Subscriber interface {
	// Subscribe starts delivering the priority's messages with at most prefetch
	// unsettled at once. The channel closes when ctx ends or on Close.
	Subscribe(ctx context.Context, lane job.Priority, prefetch int) (<-chan Delivery, error)
	Close() error
}

// DeadLetterReader takes envelopes off the dead-letter queue (the
// reconciler, DLQ tooling, tests). Messages the broker dead-lettered by
// itself (RabbitMQ's x-delivery-limit) come back as an envelope with Reason
// ReasonDeliveryLimit and the original body.
type DeadLetterReader interface {
	// DrainDeadLetters waits until at least one dead letter is available
	// (or ctx ends), takes those immediately available, at most max, and
	// hands them to record; they leave the dead-letter queue only when
	// record returns nil. On an error from record they stay and are handed
	// out again by a later call (RabbitMQ requeues them behind the others),
	// so a crash or a store outage while recording loses none.
	DrainDeadLetters(ctx context.Context, max int, record func([]DeadLetter) error) error
	// ReadDeadLetters is DrainDeadLetters that returns what it took.
	ReadDeadLetters(ctx context.Context, max int) ([]DeadLetter, error)
}

// ReadDeadLetters implements DeadLetterReader.ReadDeadLetters over a
// driver's drain.
func ReadDeadLetters(ctx context.Context, max int,
	drain func(ctx context.Context, max int, record func([]DeadLetter) error) error) ([]DeadLetter, error) {
	var out []DeadLetter
	err := drain(ctx, max, func(dls []DeadLetter) error {
		out = append(out, dls...)
		return nil
	})
	return out, err
}

// ReasonDeliveryLimit is the DeadLetter.Reason of a message the broker
// dead-lettered after too many redeliveries.
const ReasonDeliveryLimit = "delivery_limit"

// Inspector measures backlog for back-pressure.
type Inspector interface {
	// Depth is the number of messages waiting for the priority: those on
	// its intake plus those on its internal lane (RabbitMQ: both queues'
	// ready messages; Kafka: both consumer groups' lag; memory: both lists).
	Depth(ctx context.Context, lane job.Priority) (int64, error)
	Close() error
}

// BatchAcker is implemented by deliveries whose broker settles many
// messages in one operation more cheaply than one by one (RabbitMQ: one
// basic.ack with multiple=true for a run of consecutive delivery tags).
// Callers use AckAll rather than calling it directly.
type BatchAcker interface {
	// AckBatch acks every delivery of ds, each exactly as its own Ack
	// would, and returns one error per delivery (nil: acked). ds may hold
	// deliveries of other drivers or subscriptions; those are acked by
	// their Ack.
	AckBatch(ctx context.Context, ds []Delivery) []error
}

// AckAll acks every delivery of ds and returns one error per delivery, in
// the order of ds (nil: acked). Each delivery is settled as by its own Ack
// (a second settlement returns ErrSettled); a driver that implements
// BatchAcker acks them together.
func AckAll(ctx context.Context, ds []Delivery) []error {
	if len(ds) == 0 {
		return nil
	}
	if ba, ok := ds[0].(BatchAcker); ok {
		return ba.AckBatch(ctx, ds)
	}
	errs := make([]error, len(ds))
	for i, d := range ds {
		errs[i] = d.Ack(ctx)
	}
	return errs
}
