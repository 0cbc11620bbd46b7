package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Error dialects of 429 bodies.
const (
	DialectOpenAI    = "openai"    // {"error":{"message","type","code"}}
	DialectDashScope = "dashscope" // {"code":"Throttling.*","message","request_id"}
)

// Config is the whole simulator: the YAML file of cmd/llmsim, or built in code.
// The zero value of every optional field means "off".
type Config struct {
	// Dialect of 429 bodies: "openai" (default) or "dashscope". Other errors
	// (400, 401, 404, 5xx) always use the OpenAI error object, as DashScope's
	// compatible mode does.
	Dialect string `yaml:"dialect" json:"dialect"`
	// APIKeys, when non-empty, are the bearer keys accepted on every endpoint;
	// anything else gets 401. Keys never appear in responses or logs.
	APIKeys []string `yaml:"api_keys" json:"-"`
	// Headers selects the optional response headers.
	Headers HeaderConfig `yaml:"headers" json:"headers"`
	// Latency is the default for models without their own.
	Latency LatencyConfig `yaml:"latency" json:"latency"`
	// Output is the default output-length mix for models without their own.
	Output OutputMix `yaml:"output" json:"output"`
	// Faults are injected across all models, deterministically from Seed.
	Faults FaultConfig `yaml:"faults" json:"faults"`
	// Models by name; a request for any other model gets 404 model_not_found.
	Models map[string]ModelConfig `yaml:"models" json:"models"`
	// Batch shapes the Batch API (/v1/files, /v1/batches; batchapi.go).
	Batch BatchConfig `yaml:"batch" json:"batch"`
}

// HeaderConfig turns on optional response headers.
type HeaderConfig struct {
	// RetryAfter adds Retry-After (whole seconds, at least 1) and
	// retry-after-ms to every 429.
	RetryAfter bool `yaml:"retry_after" json:"retry_after"`
	// RateLimit adds x-ratelimit-{limit,remaining,reset}-{requests,tokens}
	// (from RPM and TPM, when set) to every chat response, 429s included.
	RateLimit bool `yaml:"rate_limit" json:"rate_limit"`
}

// ModelConfig is one model's limits and behaviour. The first seven keys are
// the ones of llmq's own `models:` section, so the same block can be pasted.
type ModelConfig struct {
	RPM int64 `yaml:"rpm" json:"rpm"` // requests per sliding 60 s; 0 = unlimited
	TPM int64 `yaml:"tpm" json:"tpm"` // input+output tokens per sliding 60 s; 0 = unlimited
	RPS int64 `yaml:"rps" json:"rps"` // requests per sliding 1 s; 0 = unlimited
	TPS int64 `yaml:"tps" json:"tps"` // tokens per sliding 1 s; 0 = unlimited
	// MaxConcurrency, Fallback and Capabilities are llmq client settings;
	// the simulator accepts and ignores them.
	MaxConcurrency int      `yaml:"max_concurrency" json:"max_concurrency,omitempty"`
	Fallback       []string `yaml:"fallback" json:"fallback,omitempty"`
	Capabilities   []string `yaml:"capabilities" json:"capabilities,omitempty"`

	// Burst is the growth-rate rule; off when Floor and Growth are zero.
	Burst BurstConfig `yaml:"burst" json:"burst"`
	// ChargeAtAdmission makes the model admit a call on its input alone,
	// as a provider that cannot know the answer's length does, and charge
	// its whole usage (input and output) to the moment it admitted it: a
	// long answer then pushes the window past the limit and later calls are
	// refused until it slides out. Off (the default), a call is admitted
	// only when its input and output both fit.
	ChargeAtAdmission bool `yaml:"charge_at_admission" json:"charge_at_admission,omitempty"`
	// MaxResponseTime is the model's maximum response time: an
	// X-DashScope-Wait-Timeout at or above it is ignored. Default 300s.
	MaxResponseTime Duration `yaml:"max_response_time" json:"max_response_time"`
	// Latency and Output override the simulator-wide defaults when set.
	Latency *LatencyConfig `yaml:"latency" json:"latency,omitempty"`
	Output  *OutputMix     `yaml:"output" json:"output,omitempty"`
	// Kind is what the model serves: "chat" (default, /chat/completions),
	// "embeddings" (/embeddings, limited on input tokens alone) or "audio"
	// (/audio/transcriptions, limited on requests and audio seconds,
	// audio.go); the other endpoints answer 400 model_not_supported.
	Kind string `yaml:"kind" json:"kind,omitempty"`
	// AudioSecondsPerMinute is an audio model's limit of audio seconds per
	// sliding 60 s (0 = unlimited); it takes the place of TPM, which an
	// audio model does not have.
	AudioSecondsPerMinute int64 `yaml:"audio_seconds_per_minute" json:"audio_seconds_per_minute,omitempty"`
	// MaxRunningTasks limits a task model's unfinished tasks (0 =
	// unlimited); its RPM and RPS limit submissions (tasks.go).
	MaxRunningTasks int64 `yaml:"max_running_tasks" json:"max_running_tasks,omitempty"`
	// TaskDuration is a task model's processing time (default 2s).
	TaskDuration Duration `yaml:"task_duration" json:"task_duration,omitempty"`
	// TaskSpread spreads processing times uniformly over TaskDuration ×
	// [1−spread, 1+spread], drawn from the task's id (0 = every task takes
	// TaskDuration; at most 0.9).
	TaskSpread float64 `yaml:"task_spread" json:"task_spread,omitempty"`
}

// Model kinds.
const (
	KindChat       = "chat"
	KindEmbeddings = "embeddings"
	KindAudio      = "audio"
	KindTask       = "task"
)

// BurstConfig is the growth-rate (traffic burst) rule. A request is refused
// with limit_burst_rate / Throttling.BurstRate when, counting it, the
// requests admitted in the last second would exceed
//
//	max(Floor, Growth × (requests admitted in the Window before that second) / Window-in-seconds)
//
// i.e. the last second may be at most Growth times the recent average rate,
// but a rate of Floor per second is always allowed. With TokenFloor set the
// same rule applies to tokens (input + output): the tokens admitted in the
// last second, counting the request, may not exceed
// max(TokenFloor, Growth × recent average tokens per second), except that a
// request arriving to an empty last second always passes this part. A
// client that starts at full speed after an idle period trips the rule; one
// that ramps up by less than Growth per Window does not.
type BurstConfig struct {
	Floor      int64    `yaml:"floor" json:"floor"`             // requests per second always allowed (≥ 1 when the rule is on)
	Growth     float64  `yaml:"growth" json:"growth"`           // allowed multiple of the recent average (≥ 1; default 1)
	Window     Duration `yaml:"window" json:"window"`           // history the average is taken over; default 10s
	TokenFloor int64    `yaml:"token_floor" json:"token_floor"` // tokens per second always allowed; 0 = requests only
}

func (b BurstConfig) enabled() bool { return b.Floor > 0 || b.Growth > 0 || b.TokenFloor > 0 }

// LatencyConfig is the response time of an admitted request:
// TTFT + output_tokens × TPT', where TPT' = TPT × inflight/Capacity once the
// model's in-flight requests exceed Capacity (0 = no congestion). All zero by
// default, so benchmarks are not bounded by the simulator.
type LatencyConfig struct {
	TTFT     Duration `yaml:"ttft" json:"ttft"`
	TPT      Duration `yaml:"tpt" json:"tpt"`
	Capacity int64    `yaml:"capacity" json:"capacity"`
}

// OutputMix picks a reply's length deterministically from a hash of the
// request's messages: Long tokens for a LongShare of requests, Short tokens
// for the rest, capped by max_tokens / max_completion_tokens.
// Default {short: 30, long: 600, long_share: 0.3}.
type OutputMix struct {
	Short     int64   `yaml:"short" json:"short"`
	Long      int64   `yaml:"long" json:"long"`
	LongShare float64 `yaml:"long_share" json:"long_share"`
}

// FaultConfig injects provider faults in a deterministic sequence: the n-th
// chat request that reaches a known model draws the n-th number of a PCG
// generator seeded with Seed. Faulted requests still count against the
// quota (requests and input tokens, as a platform charges what it admitted).
type FaultConfig struct {
	Seed        uint64  `yaml:"seed" json:"seed"`
	ErrorRate   float64 `yaml:"error_rate" json:"error_rate"`     // share answered 500 or 503 (half each)
	TimeoutRate float64 `yaml:"timeout_rate" json:"timeout_rate"` // share that hang
	// Timeout is how long a hanging request hangs before a 504; 0 = until
	// the client gives up (or the simulator closes).
	Timeout   Duration `yaml:"timeout" json:"timeout"`
	ResetRate float64  `yaml:"reset_rate" json:"reset_rate"` // share whose connection is reset
}

func (f FaultConfig) enabled() bool { return f.ErrorRate > 0 || f.TimeoutRate > 0 || f.ResetRate > 0 }

// Duration is a time.Duration written as "1.5s" in YAML and JSON (a bare
// number means seconds).
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

func parseDuration(s string) (Duration, error) {
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return Duration(f * float64(time.Second)), nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (want e.g. 250ms, 10s)", s)
	}
	return Duration(v), nil
}

// UnmarshalYAML accepts "250ms", "10s" or a number of seconds.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*d = v
	return nil
}

// UnmarshalJSON accepts "250ms", "10s" or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := string(b)
	if u, err := strconv.Unquote(s); err == nil {
		s = u
	}
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// MarshalJSON writes the duration as a string such as "1.5s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// MarshalYAML writes the duration as a string such as "1.5s".
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// Defaults.
const (
	defaultMaxResponseTime = 300 * time.Second
	defaultBurstWindow     = 10 * time.Second
)

// DefaultOutputMix is the output mix used when none is configured.
var defaultOutputMix = OutputMix{Short: 30, Long: 600, LongShare: 0.3}

// DefaultConfig is what `llmsim --addr` serves without --config: qwen-plus
// (600 RPM, 1,000,000 TPM) and qwen-flash (1,200 RPM, 5,000,000 TPM), each
// with a burst rule at twice its steady per-second rate, zero latency, no
// faults, no keys, OpenAI dialect with Retry-After and x-ratelimit headers.
func DefaultConfig() Config {
	return Config{
		Dialect: DialectOpenAI,
		Headers: HeaderConfig{RetryAfter: true, RateLimit: true},
		Models: map[string]ModelConfig{
			"qwen-plus": {RPM: 600, TPM: 1_000_000,
				Burst: BurstConfig{Floor: 20, Growth: 2, Window: Duration(defaultBurstWindow)}},
			"qwen-flash": {RPM: 1200, TPM: 5_000_000,
				Burst: BurstConfig{Floor: 40, Growth: 2, Window: Duration(defaultBurstWindow)}},
		},
	}.WithDefaults()
}

// WithDefaults returns c with unset fields given their defaults.
func (c Config) WithDefaults() Config {
	if c.Dialect == "" {
		c.Dialect = DialectOpenAI
	}
	if c.Output == (OutputMix{}) {
		c.Output = defaultOutputMix
	}
	models := make(map[string]ModelConfig, len(c.Models))
	for name, m := range c.Models {
		models[name] = m.WithDefaults()
	}
	c.Models = models
	return c
}

// WithDefaults returns m with unset fields given their defaults.
func (m ModelConfig) WithDefaults() ModelConfig {
	if m.MaxResponseTime == 0 {
		m.MaxResponseTime = Duration(defaultMaxResponseTime)
	}
	if m.Burst.enabled() && m.Burst.Window == 0 {
		m.Burst.Window = Duration(defaultBurstWindow)
	}
	if m.Burst.enabled() && m.Burst.Growth == 0 {
		m.Burst.Growth = 1
	}
	if m.Kind == "" {
		m.Kind = KindChat
	}
	return m
}

// Validate reports the first invalid setting, naming its key.
func (c Config) Validate() error {
	if c.Dialect != DialectOpenAI && c.Dialect != DialectDashScope {
		return fmt.Errorf("dialect: %q is not %q or %q", c.Dialect, DialectOpenAI, DialectDashScope)
	}
	for i, k := range c.APIKeys {
		if strings.TrimSpace(k) == "" {
			return fmt.Errorf("api_keys[%d]: empty key", i)
		}
	}
	if err := c.Batch.validate(); err != nil {
		return err
	}
	if err := c.Latency.validate("latency"); err != nil {
		return err
	}
	if err := c.Output.validate("output"); err != nil {
		return err
	}
	f := c.Faults
	for _, r := range []struct {
		key string
		v   float64
	}{{"faults.error_rate", f.ErrorRate}, {"faults.timeout_rate", f.TimeoutRate}, {"faults.reset_rate", f.ResetRate}} {
		if r.v < 0 || r.v > 1 || math.IsNaN(r.v) {
			return fmt.Errorf("%s: %v is not within [0, 1]", r.key, r.v)
		}
	}
	if f.ErrorRate+f.TimeoutRate+f.ResetRate > 1 {
		return errors.New("faults: error_rate + timeout_rate + reset_rate exceeds 1")
	}
	if f.Timeout < 0 {
		return fmt.Errorf("faults.timeout: negative (%v)", f.Timeout)
	}
	if len(c.Models) == 0 {
		return errors.New("models: at least one model is required")
	}
	names := make([]string, 0, len(c.Models))
	for n := range c.Models {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := c.Models[n].validate("models." + n); err != nil {
			return err
		}
	}
	return nil
}

// Validate reports the first invalid setting of one model.
func (m ModelConfig) Validate() error { return m.validate("model") }

func (m ModelConfig) validate(key string) error {
	for _, l := range []struct {
		k string
		v int64
	}{{"rpm", m.RPM}, {"tpm", m.TPM}, {"rps", m.RPS}, {"tps", m.TPS}} {
		if l.v < 0 {
			return fmt.Errorf("%s.%s: negative (%d)", key, l.k, l.v)
		}
	}
	if m.MaxConcurrency < 0 {
		return fmt.Errorf("%s.max_concurrency: negative (%d)", key, m.MaxConcurrency)
	}
	if m.MaxResponseTime < 0 {
		return fmt.Errorf("%s.max_response_time: negative (%v)", key, m.MaxResponseTime)
	}
	if m.Kind != "" && m.Kind != KindChat && m.Kind != KindEmbeddings && m.Kind != KindAudio && m.Kind != KindTask {
		return fmt.Errorf("%s.kind: %q is not chat, embeddings, audio or task", key, m.Kind)
	}
	if (m.MaxRunningTasks != 0 || m.TaskDuration != 0 || m.TaskSpread != 0) && m.Kind != KindTask {
		return fmt.Errorf("%s: max_running_tasks, task_duration and task_spread are a task model's (kind: task)", key)
	}
	if m.MaxRunningTasks < 0 || m.TaskDuration < 0 {
		return fmt.Errorf("%s: max_running_tasks and task_duration must not be negative", key)
	}
	if m.TaskSpread < 0 || m.TaskSpread > 0.9 {
		return fmt.Errorf("%s.task_spread: %v is not within [0, 0.9]", key, m.TaskSpread)
	}
	if err := m.validateAudio(key); err != nil {
		return err
	}
	b := m.Burst
	if b.Floor < 0 || (b.enabled() && b.Floor < 1) {
		return fmt.Errorf("%s.burst.floor: %d is below 1 (the rule needs a rate it always allows)", key, b.Floor)
	}
	if b.TokenFloor < 0 {
		return fmt.Errorf("%s.burst.token_floor: negative (%d)", key, b.TokenFloor)
	}
	if b.Growth != 0 && (b.Growth < 1 || math.IsNaN(b.Growth) || math.IsInf(b.Growth, 0)) {
		return fmt.Errorf("%s.burst.growth: %v is below 1", key, b.Growth)
	}
	if b.Window < 0 || (b.Window > 0 && b.Window.D() < time.Second) {
		return fmt.Errorf("%s.burst.window: %v is below 1s", key, b.Window)
	}
	if m.Latency != nil {
		if err := m.Latency.validate(key + ".latency"); err != nil {
			return err
		}
	}
	if m.Output != nil {
		if err := m.Output.validate(key + ".output"); err != nil {
			return err
		}
	}
	return nil
}

func (l LatencyConfig) validate(key string) error {
	if l.TTFT < 0 {
		return fmt.Errorf("%s.ttft: negative (%v)", key, l.TTFT)
	}
	if l.TPT < 0 {
		return fmt.Errorf("%s.tpt: negative (%v)", key, l.TPT)
	}
	if l.Capacity < 0 {
		return fmt.Errorf("%s.capacity: negative (%d)", key, l.Capacity)
	}
	return nil
}

func (o OutputMix) validate(key string) error {
	if o == (OutputMix{}) {
		return nil
	}
	if o.Short < 1 {
		return fmt.Errorf("%s.short: %d is below 1", key, o.Short)
	}
	if o.Long < 1 {
		return fmt.Errorf("%s.long: %d is below 1", key, o.Long)
	}
	if o.LongShare < 0 || o.LongShare > 1 || math.IsNaN(o.LongShare) {
		return fmt.Errorf("%s.long_share: %v is not within [0, 1]", key, o.LongShare)
	}
	return nil
}

// ParseConfig decodes a YAML config, rejecting unknown keys, applies the
// defaults and validates it.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("parse simulator config: %w", err)
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("simulator config: %w", err)
	}
	return c, nil
}

// LoadConfig reads and parses the YAML config at path.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read simulator config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
