package config

import "time"

// The sections of Config, one type per YAML key (docs/design.md#configuration).

// Ingest tunes the intake: reading what producers publish, recording it in
// Postgres and forwarding it to the lanes (internal/ingest).
type Ingest struct {
	// Prefetch is the intake prefetch per lane (default 1000).
	Prefetch int `yaml:"prefetch"`
}

// Reconciler tunes the repair of drift between Postgres and the broker
// (internal/reconcile).
type Reconciler struct {
	// Interval between sweeps (default 1s).
	Interval time.Duration `yaml:"interval"`
	// LostAfter is how long a message may go unconsumed while its lane has
	// nothing waiting before it is published again (default 30s).
	LostAfter time.Duration `yaml:"lost_after"`
}

// Provider is one endpoint the consumers call: the legacy provider:
// section (the implicit provider "default") or an entry of providers:
// (providers.go, docs/design.md#providers).
type Provider struct {
	// BaseURL ends in …/v1 or …/compatible-mode/v1 (LLMQ_PROVIDER_BASE_URL,
	// LLMQ_PROVIDERS_<NAME>_BASE_URL).
	BaseURL string `yaml:"base_url"`
	// NativeBaseURL is DashScope's native API (…/api/v1), for what its
	// compatible mode does not serve; only with dialect dashscope.
	NativeBaseURL string `yaml:"native_base_url"`
	// APIKey is never logged, stored or echoed (LLMQ_PROVIDER_API_KEY,
	// LLMQ_PROVIDERS_<NAME>_API_KEY).
	APIKey Secret `yaml:"api_key"`
	// APIKeyFile, when set, is read for the key (a mounted Kubernetes secret).
	APIKeyFile string `yaml:"api_key_file"`
	// Dialect is the provider's API family: "openai" (default) or
	// "dashscope" (which has a native API beside its compatible mode).
	Dialect string `yaml:"dialect"`
	// Timeout is the base per-call timeout (default 120s).
	Timeout time.Duration `yaml:"timeout"`
	// WaitTimeout, when positive, is sent as X-DashScope-Wait-Timeout so the
	// provider queues burst-limited calls; the client timeout grows by it.
	WaitTimeout time.Duration `yaml:"wait_timeout"`
	// Stream makes calls with stream=true and include_usage.
	Stream bool `yaml:"stream"`
	// Headers are sent with every call (an organisation or project header,
	// a gateway's routing key). Their values are treated like the key:
	// never logged or echoed. YAML only; Authorization is the key's.
	Headers map[string]Secret `yaml:"headers"`
}

// Model holds one model's quota and behaviour.
type Model struct {
	// Provider names the entry of providers: that serves the model
	// (default "default": the provider: section).
	Provider string `yaml:"provider"`
	// Upstream is the model's name at its provider (default: its key under
	// models:). Two entries may name one upstream model on two providers;
	// each has its own limits and its own shared quota.
	Upstream       string        `yaml:"upstream"`
	RPM            float64       `yaml:"rpm"`
	TPM            float64       `yaml:"tpm"`
	RPS            float64       `yaml:"rps"`
	TPS            float64       `yaml:"tps"`
	MaxConcurrency int           `yaml:"max_concurrency"`
	Fallback       []string      `yaml:"fallback"`
	Capabilities   []string      `yaml:"capabilities"`
	Strategy       string        `yaml:"strategy"`
	Warmup         time.Duration `yaml:"warmup"`
	// Price is what the model costs per million tokens (GET /v1/usage).
	Price Price `yaml:"price"`
	// Batch offloads the model's tolerant work to the Batch API (batch.go).
	Batch Batch `yaml:"batch"`

	// Kind is the kind of job the model serves: chat (default),
	// embeddings, task or audio (internal/job/kind.go). A job of another
	// kind is refused at submission, and fallbacks stay within the kind.
	Kind string `yaml:"kind"`
	// AudioSecondsPerMinute limits an audio model's audio seconds per
	// minute, the unit it is metered in besides requests (in the place of
	// TPM, which an audio model does not have).
	AudioSecondsPerMinute float64 `yaml:"audio_seconds_per_minute"`
	// TaskEndpoint is where a task model's tasks are submitted on
	// DashScope's native API, under services/aigc/ (default
	// text2image/image-synthesis; video: video-generation/video-synthesis).
	TaskEndpoint string `yaml:"task_endpoint"`
}

// Worker tunes the consumer loop.
type Worker struct {
	// ID names this replica in leases and logs (default hostname-pid).
	ID string `yaml:"id"`
	// Prefetch is the broker prefetch per lane (default 64).
	Prefetch int `yaml:"prefetch"`
	// Weights of the lanes for weighted fair scheduling (default 6:3:1).
	WeightHigh   int `yaml:"weight_high"`
	WeightNormal int `yaml:"weight_normal"`
	WeightLow    int `yaml:"weight_low"`
	// Lease is how long a running job stays owned without a heartbeat (default 60s).
	Lease time.Duration `yaml:"lease"`
	// FallbackAfter429 is how many 429s on one model send a job down its fallback chain (default 2).
	FallbackAfter429 int `yaml:"fallback_after_429"`
	// RetryBase and RetryMax bound backoff between attempts (default 1s, 5m).
	RetryBase time.Duration `yaml:"retry_base"`
	RetryMax  time.Duration `yaml:"retry_max"`
	// ShutdownGrace is how long SIGTERM waits for in-flight calls (default 30s).
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// MaxInFlight caps jobs held by one replica at once (default
	// DefaultMaxInFlight).
	MaxInFlight int `yaml:"max_in_flight"`
	// TenantHold is how many jobs of one tenant, model and lane a replica
	// keeps waiting for admission; more are parked in Postgres and
	// published again when there is room, so a tenant's flood never fills
	// the lanes ahead of other tenants (default prefetch/4).
	TenantHold int `yaml:"tenant_hold"`
	// LanesOnly sends every job the ingester stores through a lane; by
	// default a replica with room runs a job it reads off the intake itself,
	// stored already claimed (the direct intake, docs/design.md#direct-intake).
	LanesOnly bool `yaml:"lanes_only"`
	// StoreDelay is how long a job a replica runs straight off the intake
	// may run before its row is written: one whose call succeeds by then
	// is written once, with its result (docs/design.md#write-once; default
	// 200ms, at most 1s; negative: the row is written before the call).
	StoreDelay time.Duration `yaml:"store_delay"`
	// TaskPollInterval is how often a running task job's task is polled
	// (default 1s) until its model's task times are known; then the
	// longest wait between polls (internal/worker/task_schedule.go).
	TaskPollInterval time.Duration `yaml:"task_poll_interval"`
}

// Backpressure sets when producers are told to slow down.
type Backpressure struct {
	// SoftLimit is the backlog above which the state is "throttled" (default 10000).
	SoftLimit int64 `yaml:"soft_limit"`
	// HardLimit is the backlog above which submissions get 429 (default 50000).
	HardLimit int64 `yaml:"hard_limit"`
	// StatusInterval is how often llmq.status is published (default 5s).
	StatusInterval time.Duration `yaml:"status_interval"`
	// LaneMaxLength, when positive, sets RabbitMQ x-max-length per lane.
	LaneMaxLength int64 `yaml:"lane_max_length"`
}

// Limits bound what one job may ask for.
type Limits struct {
	MaxPayloadBytes int `yaml:"max_payload_bytes"`
	MaxOutputTokens int `yaml:"max_output_tokens"`
	// RequestFields says what to do with request fields that multiply a
	// call's cost (n, service_tier, store, enable_search, ...): YAML only.
	RequestFields map[string]RequestField `yaml:"request_fields"`
}

// RequestField is the rule for one cost-multiplying request field.
type RequestField struct {
	// Action is "allow", "refuse" (a job that sets the field is refused) or
	// "cap" (a numeric value above Max is refused).
	Action string `yaml:"action"`
	// Max bounds a numeric field under "cap".
	Max float64 `yaml:"max"`
}

// Quota configures sharing one provider quota across consumer replicas.
type Quota struct {
	// Shared makes replicas that share a Postgres share the provider quota
	// through it (the default: the quota belongs to the account). Set false
	// only when each replica calls its own account.
	Shared bool `yaml:"shared"`
	// LeaseTTL is how long a replica's slice lives without renewal (default 10s).
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// FallbackShare is the fraction of the quota a replica uses alone when it
	// cannot reach Postgres (default 0.25).
	FallbackShare float64 `yaml:"fallback_share"`
	// FailClosed makes a replica that cannot reach Postgres send nothing
	// instead of using FallbackShare.
	FailClosed bool `yaml:"fail_closed"`
}
