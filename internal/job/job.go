package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/jsonscan"
)

// Priority selects the lane a job travels in.
type Priority string

const (
	PriorityHigh   Priority = "high"
	PriorityNormal Priority = "normal"
	PriorityLow    Priority = "low"
)

// Priorities lists the lanes from most to least urgent.
var Priorities = []Priority{PriorityHigh, PriorityNormal, PriorityLow}

// Valid reports whether p names a lane.
func (p Priority) Valid() bool {
	return p == PriorityHigh || p == PriorityNormal || p == PriorityLow
}

// DefaultTenant owns queue messages that name no tenant.
const DefaultTenant = "default"

// DefaultMaxAttempts applies when a job does not set max_attempts.
const DefaultMaxAttempts = 5

// MaxAttemptsLimit is the largest max_attempts a job may ask for.
const MaxAttemptsLimit = 50

// Job is one LLM job exactly as it travels on RabbitMQ, Kafka and POST /v1/jobs.
// A job is identified by (Tenant, ID).
type Job struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant,omitempty"`
	Model  string `json:"model"`
	// Kind is what the job asks of its model (kind.go); "" is chat.
	Kind           Kind            `json:"kind,omitempty"`
	FallbackModels []string        `json:"fallback_models,omitempty"`
	Priority       Priority        `json:"priority,omitempty"`
	Request        json.RawMessage `json:"request"`
	MaxAttempts    int             `json:"max_attempts,omitempty"`
	Deadline       *time.Time      `json:"deadline,omitempty"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
	// Where the result goes besides Postgres (destination.go): an AMQP
	// reply queue, a webhook, a Kafka topic.
	ReplyTo       string `json:"reply_to,omitempty"`
	CorrelationID string `json:"correlation_id,omitempty"`
	CallbackURL   string `json:"callback_url,omitempty"`
	ResultTopic   string `json:"result_topic,omitempty"`
	// TraceParent and TraceState are the W3C trace context the job carries
	// in its row (docs/design.md#tracing): taken from the headers of the
	// request or message that brought it, never from its JSON, so they
	// play no part in comparing two submissions of a job.
	TraceParent string `json:"-"`
	TraceState  string `json:"-"`
}

// Limits bounds what a job may ask for. The zero value means the defaults.
type Limits struct {
	// MaxPayloadBytes caps the encoded job (default 1 MiB).
	MaxPayloadBytes int
	// MaxOutputTokens caps request.max_tokens (default 131072).
	MaxOutputTokens int
	// RequestFields are the rules for request fields that multiply a
	// call's cost, over DefaultRequestFields (fields.go).
	RequestFields map[string]FieldRule
}

// WithDefaults fills unset limits.
func (l Limits) WithDefaults() Limits {
	if l.MaxPayloadBytes <= 0 {
		l.MaxPayloadBytes = 1 << 20
	}
	if l.MaxOutputTokens <= 0 {
		l.MaxOutputTokens = 131072
	}
	return l
}

// ValidationError names the field of a job and the rule it breaks.
type ValidationError struct {
	Field string
	Rule  string
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return "invalid job: " + e.Rule
	}
	return fmt.Sprintf("invalid job: %s: %s", e.Field, e.Rule)
}

func invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Field: field, Rule: fmt.Sprintf(format, args...)}
}

// IsValidation reports whether err is (or wraps) a *ValidationError.
func IsValidation(err error) bool {
	var v *ValidationError
	return errors.As(err, &v)
}

// The contract's name rules: [A-Za-z0-9._:-]{1,128} for an ID,
// [A-Za-z0-9_-]{1,64} for a tenant and [A-Za-z0-9._:/-]{1,128} for a
// model.
var (
	idChars = newCharset("._:-")
	// No dots: a tenant is the first word of a result event's routing key
	// (<tenant>.<status>) and of its reply queues (llmq.reply.<tenant>.…).
	tenantChars = newCharset("_-")
	modelChars  = newCharset("._:/-")
)

const (
	maxIDLen     = 128
	maxTenantLen = 64
	maxModelLen  = 128
)

// ValidID reports whether id satisfies the contract's ID rule. IDs made
// only of dots ("." and "..") are refused: HTTP routers clean them out of
// paths, so such a job could never be polled.
func ValidID(id string) bool {
	return idChars.matches(id, maxIDLen) && strings.Trim(id, ".") != ""
}

// ValidTenant reports whether t is a usable tenant name.
func ValidTenant(t string) bool { return tenantChars.matches(t, maxTenantLen) }

// Normalize applies the contract's defaults: tenant "default", kind
// "chat", priority "normal" and DefaultMaxAttempts.
func (j *Job) Normalize() {
	j.Kind = KindOf(j.Kind)
	if j.Tenant == "" {
		j.Tenant = DefaultTenant
	}
	if j.Priority == "" {
		j.Priority = PriorityNormal
	}
	if j.MaxAttempts == 0 {
		j.MaxAttempts = DefaultMaxAttempts
	}
}

// Validate checks every rule of the contract and returns the first broken
// one as a *ValidationError. Call Normalize first. A deadline must lie after
// now: Validate judges a job being submitted.
func (j *Job) Validate(now time.Time, lim Limits) error {
	return j.validate(now, lim, true)
}

// validate checks the contract's rules; the deadline rule only if
// deadlineRule.
func (j *Job) validate(now time.Time, lim Limits, deadlineRule bool) error {
	lim = lim.WithDefaults()
	if j.ID == "" {
		return invalid("id", "is required")
	}
	if !ValidID(j.ID) {
		return invalid("id", "must be 1..128 characters of [A-Za-z0-9._:-], not only dots")
	}
	if !ValidTenant(j.Tenant) {
		return invalid("tenant", "must be 1..64 characters of [A-Za-z0-9_-]")
	}
	if j.Model == "" {
		return invalid("model", "is required")
	}
	if !modelChars.matches(j.Model, maxModelLen) {
		return invalid("model", "must be 1..128 characters of [A-Za-z0-9._:/-]")
	}
	for i, m := range j.FallbackModels {
		if !modelChars.matches(m, maxModelLen) {
			return invalid(fmt.Sprintf("fallback_models[%d]", i), "must be 1..128 characters of [A-Za-z0-9._:/-]")
		}
	}
	if !j.Priority.Valid() {
		return invalid("priority", "must be one of high, normal, low")
	}
	if !j.Kind.Valid() {
		return invalid("kind", "must be one of chat, embeddings, task, audio; got %q", j.Kind)
	}
	if j.MaxAttempts < 1 || j.MaxAttempts > MaxAttemptsLimit {
		return invalid("max_attempts", "must be between 1 and %d", MaxAttemptsLimit)
	}
	if deadlineRule && j.Deadline != nil && !j.Deadline.After(now) {
		return invalid("deadline", "is in the past")
	}
	if len(j.Metadata) > 0 {
		if t := firstByte(j.Metadata); t != '{' && t != 'n' {
			return invalid("metadata", "must be an object")
		}
	}
	if err := j.validateDestinations(); err != nil {
		return err
	}
	if err := j.checkStorable(); err != nil {
		return err
	}
	if j.Kind != KindChat {
		return validateKindRequest(j.Kind, j.Request, lim)
	}
	return validateRequest(j.Request, lim)
}

func firstByte(b []byte) byte {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// chatRequest is the part of an OpenAI chat body that llmq inspects, read
// by exact key: a provider reads "messages", not "Messages", so llmq does
// too (encoding/json's struct decoding would match either).
type chatRequest struct {
	Messages  []json.RawMessage
	MaxTokens json.RawMessage
	// max_completion_tokens is OpenAI's newer name for the same cap.
	MaxCompletionTokens json.RawMessage
	// Fields are every top-level field, for the request-field rules.
	Fields map[string]json.RawMessage
}

// readChatRequest reads the keys llmq inspects from a request object. It
// walks the bytes once (jsonscan): the request was checked when its job
// was decoded, and a second decoder pass here cost as much as the first.
func readChatRequest(raw json.RawMessage) (chatRequest, error) {
	fields := make(map[string]json.RawMessage, 8)
	if !jsonscan.Members(raw, func(k string, v []byte) bool { fields[k] = v; return true }) {
		// Not an object the walker could read: the decoder says why.
		fields = nil
		if err := json.Unmarshal(raw, &fields); err != nil {
			return chatRequest{}, err
		}
	}
	req := chatRequest{MaxTokens: fields["max_tokens"], MaxCompletionTokens: fields["max_completion_tokens"], Fields: fields}
	if m, ok := fields["messages"]; ok && firstByte(m) != 'n' {
		if !jsonscan.Elements(m, func(e []byte) bool { req.Messages = append(req.Messages, e); return true }) {
			return chatRequest{}, &json.UnmarshalTypeError{Value: "non-array", Field: "messages"}
		}
	}
	return req, nil
}

// outputCap reads a max_tokens value: a JSON integer (not a string that
// holds one, which a provider would receive as a string), or null.
func outputCap(raw json.RawMessage) (v int64, set bool, ok bool) {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 || string(b) == "null" {
		return 0, false, true
	}
	if b[0] != '-' && (b[0] < '0' || b[0] > '9') {
		return 0, true, false
	}
	v, err := json.Number(b).Int64()
	return v, true, err == nil
}

func validateRequest(raw json.RawMessage, lim Limits) error {
	if len(raw) == 0 || firstByte(raw) == 'n' {
		return invalid("request", "is required")
	}
	if firstByte(raw) != '{' {
		return invalid("request", "must be an object (an OpenAI chat-completions body)")
	}
	req, err := readChatRequest(raw)
	if err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return invalid("request."+typeErr.Field, "has the wrong type (JSON %s)", typeErr.Value)
		}
		return invalid("request", "malformed: %v", err)
	}
	if len(req.Messages) == 0 {
		return invalid("request.messages", "must be a non-empty array")
	}
	for i, m := range req.Messages {
		if firstByte(m) != '{' {
			return invalid(fmt.Sprintf("request.messages[%d]", i), "must be an object with role and content")
		}
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"request.max_tokens", req.MaxTokens}, {"request.max_completion_tokens", req.MaxCompletionTokens}} {
		v, set, ok := outputCap(f.raw)
		if set && (!ok || v < 1 || v > int64(lim.MaxOutputTokens)) {
			return invalid(f.name, "must be an integer between 1 and %d", lim.MaxOutputTokens)
		}
	}
	return checkRequestFields(req.Fields, lim.requestFields())
}

// MaxTokens returns the most output tokens the call can be billed: the
// request's output cap (max_tokens or max_completion_tokens) times its
// Choices, since each of n choices is capped alone; 0 when it sets no cap.
func (j *Job) MaxTokens() int {
	req, err := readChatRequest(j.Request)
	if err != nil {
		return 0
	}
	for _, raw := range []json.RawMessage{req.MaxTokens, req.MaxCompletionTokens} {
		if v, set, ok := outputCap(raw); set && ok {
			return int(v) * req.choices()
		}
	}
	return 0
}

// Parse is Decode, Normalize and Validate in one step, for a job being
// submitted (producer submit reads its file with it): a deadline must lie
// after now. A consumer parses what it takes off a queue with ParseQueued.
func Parse(data []byte, now time.Time, lim Limits) (Job, error) {
	return parse(data, now, "", Properties{}, lim, true)
}

// ParseQueued is Parse for a message already queued, as the ingester reads
// the intake: a message that names no priority takes lane's (its routing
// key or topic), and every rule applies but the one that a deadline lie in
// the future. A job whose deadline passed while it waited is still a
// well-formed job; it is stored and its claim marks it dead ("deadline
// passed") rather than refusing it as malformed.
func ParseQueued(data []byte, lane Priority, lim Limits) (Job, error) {
	return parse(data, time.Time{}, lane, Properties{}, lim, false)
}

// Properties are what an intake message says of its job outside its body:
// the AMQP reply_to and correlation_id properties, and the tenant its
// broker identity belongs to (the ingester's judgement of user_id or of a
// tenant's own topic). Each fills the job's field of the same name when the
// body leaves it empty.
type Properties struct {
	ReplyTo, CorrelationID string
	Tenant                 string
}

// ParseIntake is ParseQueued for a message that carries Properties.
func ParseIntake(data []byte, lane Priority, props Properties, lim Limits) (Job, error) {
	return parse(data, time.Time{}, lane, props, lim, false)
}

func parse(data []byte, now time.Time, lane Priority, props Properties, lim Limits, deadlineRule bool) (Job, error) {
	j, err := Decode(data, lim)
	if err != nil {
		return j, err
	}
	if j.ReplyTo == "" {
		j.ReplyTo = props.ReplyTo
	}
	if j.CorrelationID == "" {
		j.CorrelationID = props.CorrelationID
	}
	if j.Tenant == "" {
		j.Tenant = props.Tenant
	}
	if j.Priority == "" {
		j.Priority = lane
	}
	j.Normalize()
	if err := j.validate(now, lim, deadlineRule); err != nil {
		return j, err
	}
	return j, nil
}

// Key is the identity of a job.
type Key struct {
	Tenant string
	ID     string
}

// Key returns the job's identity.
func (j *Job) Key() Key { return Key{Tenant: j.Tenant, ID: j.ID} }

// RequiredCapabilities lists what a model must support to serve this job's
// request: "tools" when it declares tools or functions, "json_schema" or
// "json_object" for a structured response_format. A fallback model that
// lacks one of them is never used for the job.
func (j *Job) RequiredCapabilities() []string {
	var tools, functions, format, formatTypeRaw []byte
	if !jsonscan.Pick(j.Request, []string{"tools", "functions", "response_format"}, &tools, &functions, &format) {
		return nil
	}
	var caps []string
	if isSet(tools) || isSet(functions) {
		caps = append(caps, "tools")
	}
	jsonscan.Pick(format, []string{"type"}, &formatTypeRaw)
	formatType, _ := jsonscan.String(formatTypeRaw)
	switch formatType {
	case "json_schema", "json_object":
		caps = append(caps, formatType)
	}
	return caps
}

func isSet(raw json.RawMessage) bool {
	b := bytes.TrimSpace(raw)
	return len(b) > 0 && !bytes.Equal(b, []byte("null")) && !bytes.Equal(b, []byte("[]"))
}

// ReadKey reads the key of a job message without decoding the rest: the
// id, and the tenant (DefaultTenant when absent). Lane messages are read
// this way, since the stored job, not the message, is what runs.
func ReadKey(body []byte) (Key, error) {
	var k struct {
		ID     string `json:"id"`
		Tenant string `json:"tenant"`
	}
	if err := json.Unmarshal(body, &k); err != nil {
		return Key{}, fmt.Errorf("read job key: %w", err)
	}
	if k.Tenant == "" {
		k.Tenant = DefaultTenant
	}
	if !ValidID(k.ID) || !ValidTenant(k.Tenant) {
		return Key{}, errors.New("read job key: invalid id or tenant")
	}
	return Key{Tenant: k.Tenant, ID: k.ID}, nil
}
