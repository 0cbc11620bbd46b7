package client

import (
	"encoding/json"
	"time"
)

// Status is a job's lifecycle state (docs/design.md#lifecycle):
//
//	queued ──► running ──► succeeded
//	  ▲  │        │ ├────► failed     (permanent error, or refused at intake)
//	  │  │        │ ├────► retrying ──► running …
//	  │  │        │ ├────► dead       (attempts exhausted or deadline passed)
//	  │  │        │ ├────► queued     (lease expired or handed back)
//	  │  │        │ └────► batched ──► succeeded, retrying, cancelled
//	  │  └────────┴──────► cancelled
//	  └── dead, failed    (replayed from the dead letters)
type Status string

// The statuses GET /v1/jobs/{id} reports.
const (
	StatusQueued   Status = "queued"
	StatusRunning  Status = "running"
	StatusRetrying Status = "retrying"
	// StatusBatched: offloaded to the provider's Batch API; its result
	// comes as an online one would.
	StatusBatched   Status = "batched"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusDead      Status = "dead"
	StatusCancelled Status = "cancelled"
)

// Terminal reports whether no work remains for a job in status s:
// succeeded, failed, dead or cancelled. Failed and dead jobs are terminal
// although an operator may replay them.
func (s Status) Terminal() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusDead, StatusCancelled:
		return true
	}
	return false
}

// JobStatus is a job as GET /v1/jobs/{id} reports it.
type JobStatus struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	Status Status `json:"status"`
	Model  string `json:"model"`
	// Kind is the job's kind: chat, embeddings, task or audio.
	Kind     string `json:"kind"`
	Priority string `json:"priority"`
	// ModelUsed is the model that answered (a fallback model after rate
	// limiting); empty until one did.
	ModelUsed string `json:"model_used"`
	// Attempts counts the attempts so far.
	Attempts int `json:"attempts"`
	// Response is the provider's chat-completions response, once the job
	// succeeded; nil before.
	Response json.RawMessage `json:"response"`
	// ResponseOmitted is set in a result event whose broker took it only
	// without its response (an answer larger than a Kafka message may be):
	// Response is JSON null; read the job with Client.Get to get it.
	ResponseOmitted bool `json:"response_omitted,omitempty"`
	// Usage is set once the job succeeded.
	Usage *Usage `json:"usage"`
	// Error is the last failed attempt of a job that has not succeeded.
	Error *JobError `json:"error"`
	// Metadata is the job's metadata as it was submitted.
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// CorrelationID is the one the job was submitted with (with ReplyTo).
	CorrelationID string     `json:"correlation_id,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	StartedAt     *time.Time `json:"started_at,omitempty"`
	CompletedAt   *time.Time `json:"completed_at"`
	// BatchID is, for a batched job, the llmq batch it waits in.
	BatchID *int64 `json:"batch_id,omitempty"`
	// ExpectedStartAt is, for a queued job, when it should start, from the
	// backlog ahead of it and its lane's drain rate.
	ExpectedStartAt *time.Time `json:"expected_start_at,omitempty"`
	// Webhook is where the job's latest webhook delivery stands.
	Webhook *WebhookState `json:"webhook,omitempty"`
	// AttemptLog is every attempt of the job, oldest first: GET
	// /v1/jobs/{id} fills it, lists and result events leave it nil.
	AttemptLog []Attempt `json:"attempt_log,omitempty"`
}

// Attempt is one attempt of a job's timeline (JobStatus.AttemptLog): the
// model called, how it ended, and when. Outcome is "succeeded",
// "rate_limited", "cancelled", "lease_expired" or the error's class
// ("server", "transient", "client", …).
type Attempt struct {
	Attempt          int        `json:"attempt"`
	Model            string     `json:"model,omitempty"`
	Outcome          string     `json:"outcome"`
	Kind             string     `json:"kind,omitempty"`
	HTTPStatus       int        `json:"http_status,omitempty"`
	Code             string     `json:"code,omitempty"`
	Message          string     `json:"message,omitempty"`
	ClaimedAt        *time.Time `json:"claimed_at,omitempty"`
	StartedAt        *time.Time `json:"started_at,omitempty"`
	EndedAt          time.Time  `json:"ended_at"`
	PromptTokens     int        `json:"prompt_tokens,omitempty"`
	CompletionTokens int        `json:"completion_tokens,omitempty"`
	// WaitMS is the time before the attempt's call (queue, backoff,
	// admission); AdmissionWaitMS the part between claim and call;
	// DurationMS the call's duration.
	WaitMS          int64  `json:"wait_ms"`
	AdmissionWaitMS *int64 `json:"admission_wait_ms,omitempty"`
	DurationMS      *int64 `json:"duration_ms,omitempty"`
}

// WebhookState is where a job's webhook delivery stands.
type WebhookState struct {
	Status        string     `json:"status"` // pending, delivered, dead
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error,omitempty"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
}

// Usage is the token usage of the successful call.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// JobError describes a failed attempt.
type JobError struct {
	Attempt int    `json:"attempt"`
	Model   string `json:"model,omitempty"`
	// Kind classifies the failure: "client" (a 4xx other than 429),
	// "server", "transient", "rate_limit…", "invalid" (refused at intake),
	// "deadline", "exhausted", "delivery_limit", "unstorable" (Postgres
	// would not store the provider's answer).
	Kind    string    `json:"kind"`
	Code    string    `json:"code,omitempty"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
}

// Submitted is the API's answer to one submission.
type Submitted struct {
	ID     string `json:"id"`
	Status Status `json:"status"`
	// Created is false when the tenant already had a job with this ID: the
	// job was not submitted again and Status is the existing job's.
	Created bool `json:"-"`
}

// DeadLetter is one entry of GET /v1/dlq: a job that will not be processed
// (refused at intake, attempts exhausted, deadline passed) or a message
// that is no job llmq holds.
type DeadLetter struct {
	// ID names the dead letter for Replay.
	ID int64 `json:"id"`
	// JobID is the job's ID; empty when the message's ID could not be read.
	JobID         string    `json:"job_id,omitempty"`
	Lane          Priority  `json:"lane"`
	Reason        string    `json:"reason"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error,omitempty"`
	FirstFailedAt time.Time `json:"first_failed_at"`
	LastFailedAt  time.Time `json:"last_failed_at"`
	CreatedAt     time.Time `json:"created_at"`
	// Body is the original message when it is JSON; BodyBase64 holds its
	// bytes otherwise.
	Body       json.RawMessage `json:"body,omitempty"`
	BodyBase64 []byte          `json:"body_base64,omitempty"`
}

// DeadLetterPage is one page of GET /v1/dlq, oldest first.
type DeadLetterPage struct {
	DeadLetters []DeadLetter `json:"dead_letters"`
	// NextCursor, when not empty, fetches the next page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Replayed is the answer to a replay: the job is queued again (or the
// message re-published to the intake).
type Replayed struct {
	ID     int64  `json:"id"`
	JobID  string `json:"job_id,omitempty"`
	Status Status `json:"status"`
}

// BackpressureStatus is the document of GET /v1/status (also broadcast on
// llmq.status). State is "ok", "throttled" (the backlog is over
// SoftLimit: slow down) or "full" (over HardLimit: submissions get 429).
//
// With a tenant key (Tenant is set) Backlog, Total, DrainRate and
// ETASeconds are the tenant's own and Tenants holds its entry only; State,
// SoftLimit and HardLimit stay global. With an admin key they are the
// whole system's and Tenants holds every tenant. A tenant's submissions
// also get 429 while its own state is "full" (TenantState).
type BackpressureStatus struct {
	State string `json:"state"`
	// Backlog counts the jobs waiting or running per priority.
	Backlog map[Priority]int64 `json:"backlog"`
	Total   int64              `json:"total"`
	// DrainRate is jobs finished per second over the last minute.
	DrainRate float64 `json:"drain_rate"`
	// ETASeconds is Total/DrainRate; nil while nothing drains.
	ETASeconds *float64  `json:"eta_seconds"`
	SoftLimit  int64     `json:"soft_limit"`
	HardLimit  int64     `json:"hard_limit"`
	UpdatedAt  time.Time `json:"updated_at"`
	// Tenant names the tenant a tenant-scoped document is about.
	Tenant string `json:"tenant,omitempty"`
	// Tenants is per-tenant back-pressure (see above).
	Tenants map[string]TenantBackpressure `json:"tenants,omitempty"`
	// TenantStates is the state of each tenant with a backlog limit, on
	// llmq.status and for an admin: states only, no numbers.
	TenantStates map[string]string `json:"tenant_states,omitempty"`
}

// TenantBackpressure is one tenant's back-pressure, against its own
// backlog limit (tenants.<name>.backlog_limit).
type TenantBackpressure struct {
	// State is "ok", "throttled" or "full" (the tenant's submissions get
	// 429 with a Retry-After from its own drain rate); always "ok" for a
	// tenant without a limit.
	State string `json:"state"`
	// Backlog is the tenant's jobs waiting or running.
	Backlog int64 `json:"backlog"`
	// BacklogLimit is 0 for none.
	BacklogLimit int64 `json:"backlog_limit"`
	// DrainRate is the tenant's jobs finished per second over the last
	// minute.
	DrainRate float64 `json:"drain_rate"`
	// ETASeconds is Backlog/DrainRate; nil while the tenant drains nothing.
	ETASeconds *float64 `json:"eta_seconds"`
}

// TenantState is tenant's own state in s: from Tenants, else from
// TenantStates (llmq.status), else "ok" (no limit of its own). Its
// submissions are refused while this or State is "full".
func (s BackpressureStatus) TenantState(tenant string) string {
	if t, ok := s.Tenants[tenant]; ok {
		return t.State
	}
	if st, ok := s.TenantStates[tenant]; ok {
		return st
	}
	return "ok"
}
