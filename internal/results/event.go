package results

import (
	"time"

	"github.com/llmq/llmq/internal/job"
)

// EventVersion is the version of the result event document; a reader
// refuses a version it does not know. A change that removes or retypes a
// field is a new version; adding a field is not.
const EventVersion = 1

// Names on the brokers (docs/design.md#results).
const (
	// Exchange is RabbitMQ's topic exchange of result events, routing key
	// "<tenant>.<status>"; Topic is Kafka's topic of them, keyed by job id.
	Exchange = "llmq.results"
	Topic    = "llmq.results"
)

// Event is what every path carries when a job finishes: the llmq.results
// exchange and topic, a reply_to queue, a result topic and a webhook (whose
// payload shape — type, timestamp, data — is the one Standard Webhooks
// recommends). Readers dedupe by EventID: a repeat of the same event has
// the same id.
type Event struct {
	// Type is "job." + the status: job.succeeded, job.failed, job.dead,
	// job.cancelled.
	Type    string `json:"type"`
	Version int    `json:"version"`
	EventID string `json:"event_id"`
	// Timestamp is when the job finished.
	Timestamp time.Time `json:"timestamp"`
	// Data is the finished job's document, as GET /v1/jobs/{id} shows it.
	Data Document `json:"data"`
}

// EventType is the type of the event of a job that finished in status.
func EventType(status job.Status) string { return "job." + string(status) }

// RoutingKey is the event's RabbitMQ routing key: "<tenant>.<status>", so
// a reader binds "acme.*" for one tenant or "*.failed" for one outcome.
func RoutingKey(tenant string, status job.Status) string { return tenant + "." + string(status) }
