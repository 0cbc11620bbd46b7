package client

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Priority selects the lane a job travels in; on the queues it is the
// RabbitMQ routing key and the suffix of the Kafka topic.
type Priority string

// The three priorities. An empty Priority means PriorityNormal.
const (
	PriorityHigh   Priority = "high"
	PriorityNormal Priority = "normal"
	PriorityLow    Priority = "low"
)

// Kind is what a job asks of its model (docs/design.md#kinds).
type Kind string

// The job kinds. An empty Kind means KindChat.
const (
	KindChat       Kind = "chat"
	KindEmbeddings Kind = "embeddings"
	KindTask       Kind = "task"
	KindAudio      Kind = "audio"
)

// Job is one LLM job exactly as it travels on POST /v1/jobs, on RabbitMQ
// and on Kafka (docs/design.md#job-message). A job is identified by
// (Tenant, ID), and the ID is its idempotency key: the same job submitted
// or published again is recognised and processed once.
type Job struct {
	// ID is 1..128 characters of [A-Za-z0-9._:-]. Submit and SubmitBatch
	// generate one (NewID) when it is empty; a publisher requires it.
	ID string `json:"id"`
	// Tenant owns the job. Over HTTP the API key decides it: leave it
	// empty or give the key's own tenant. On a queue, empty means "default".
	Tenant string `json:"tenant,omitempty"`
	// Model is the model to call; FallbackModels are tried, in order, only
	// when it is rate limited.
	Model          string   `json:"model"`
	FallbackModels []string `json:"fallback_models,omitempty"`
	// Kind is what the job asks of its model: KindChat (the default when
	// empty), KindEmbeddings, KindTask or KindAudio. Request is the body of
	// that kind's call, and the model must serve the kind.
	Kind Kind `json:"kind,omitempty"`
	// Priority defaults to normal.
	Priority Priority `json:"priority,omitempty"`
	// Request is the body of the kind's call (an OpenAI chat-completions
	// body for chat, an embeddings body for embeddings), passed to the
	// provider as is (llmq sets only its model).
	Request json.RawMessage `json:"request"`
	// MaxAttempts bounds the attempts (1..50; default 5). Rate limiting
	// does not use them up.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Deadline, when set, is when the job stops being worth running: past
	// it the job is dead rather than run.
	Deadline *time.Time `json:"deadline,omitempty"`
	// Metadata is a JSON object stored with the job and never sent to the
	// provider.
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// ReplyTo names a queue that receives the job's result event; it must
	// begin "llmq.reply.<tenant>." (ReplyQueue builds one). CorrelationID
	// comes back on that reply and in the job's document.
	ReplyTo       string `json:"reply_to,omitempty"`
	CorrelationID string `json:"correlation_id,omitempty"`
	// CallbackURL receives the result event as a signed webhook; its host
	// must be one the operator allowed for the tenant.
	CallbackURL string `json:"callback_url,omitempty"`
	// ResultTopic is a Kafka topic, from the tenant's allowed list, that
	// receives the result event.
	ResultTopic string `json:"result_topic,omitempty"`
}

// ReplyQueue is a reply_to queue name of tenant: "llmq.reply.<tenant>.<name>".
func ReplyQueue(tenant, name string) string { return "llmq.reply." + tenant + "." + name }

// NewID returns a random job ID in the API's own format: "j-" and 26
// base32 characters (130 random bits).
func NewID() string { return "j-" + rand.Text() }

var (
	idPattern     = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	tenantPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	modelPattern  = regexp.MustCompile(`^[A-Za-z0-9._:/-]{1,128}$`)
)

// validate checks what a queue message needs before it is worth
// publishing: its identity (id, tenant), where it goes (priority), and that
// it can be a job at all (model, request and metadata). The full rules —
// messages, token caps, deadline, configured models — are the ingester's:
// a published job that breaks one becomes a failed job and a dead letter.
func (j *Job) validate() error {
	switch {
	case j.ID == "":
		return invalid("id", "is required")
	case !idPattern.MatchString(j.ID) || strings.Trim(j.ID, ".") == "":
		return invalid("id", "must be 1..128 characters of [A-Za-z0-9._:-], not only dots")
	case j.Tenant != "" && !tenantPattern.MatchString(j.Tenant):
		return invalid("tenant", "must be 1..64 characters of [A-Za-z0-9_-]")
	case j.Model == "":
		return invalid("model", "is required")
	case !modelPattern.MatchString(j.Model):
		return invalid("model", "must be 1..128 characters of [A-Za-z0-9._:/-]")
	}
	switch j.Priority {
	case "", PriorityHigh, PriorityNormal, PriorityLow:
	default:
		return invalid("priority", "must be one of high, normal, low")
	}
	switch j.Kind {
	case "", KindChat, KindEmbeddings, KindTask, KindAudio:
	default:
		return invalid("kind", "must be one of chat, embeddings, task, audio")
	}
	if len(j.Request) == 0 || firstByte(j.Request) != '{' {
		return invalid("request", "must be an object (the body of the job kind's call)")
	}
	if len(j.Metadata) > 0 && firstByte(j.Metadata) != '{' && !isNull(j.Metadata) {
		return invalid("metadata", "must be an object")
	}
	return nil
}

// encode is the job's JSON body. Request and Metadata must be valid JSON;
// an invalid one is a *ValidationError naming it.
func (j *Job) encode() ([]byte, error) {
	for field, raw := range map[string]json.RawMessage{"request": j.Request, "metadata": j.Metadata} {
		if len(raw) > 0 && !json.Valid(raw) {
			return nil, invalid(field, "is not valid JSON")
		}
	}
	body, err := json.Marshal(j)
	if err != nil {
		return nil, fmt.Errorf("encode job %s: %w", j.ID, err)
	}
	return body, nil
}

// lane is the job's priority, normal when it names none.
func (j *Job) lane() Priority {
	if j.Priority == "" {
		return PriorityNormal
	}
	return j.Priority
}

func firstByte(b []byte) byte {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

func isNull(b []byte) bool { return bytes.Equal(bytes.TrimSpace(b), []byte("null")) }
