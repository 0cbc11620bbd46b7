// Package config loads llmq's configuration: one YAML file (path in
// LLMQ_CONFIG or --config) with every scalar overridable by an LLMQ_*
// environment variable, validated once at start with errors that name the
// key. It is built in cmd/ and passed down; nothing reads it globally.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is the whole of llmq's configuration (docs/design.md#configuration).
type Config struct {
	// PostgresURL is the pgx connection string (LLMQ_POSTGRES_URL).
	PostgresURL string `yaml:"postgres_url"`
	// PostgresTimeout bounds every store call (default 15s): a Postgres
	// that stops answering fails the call, whose work goes back to the
	// broker, and pgx cancels the statement on the server.
	PostgresTimeout time.Duration `yaml:"postgres_timeout"`
	// Broker is "rabbitmq" or "kafka" (LLMQ_BROKER).
	Broker string `yaml:"broker"`
	// AMQPURL is the RabbitMQ URL (LLMQ_AMQP_URL).
	AMQPURL Secret `yaml:"amqp_url"`
	// KafkaBrokers are host:port seeds, comma-separated in the environment.
	KafkaBrokers []string `yaml:"kafka_brokers"`
	// Kafka is TLS, SASL and topic settings (kafka.go).
	Kafka Kafka `yaml:"kafka"`
	// HTTPAddr is the producer API address (default 127.0.0.1:8080).
	HTTPAddr string `yaml:"http_addr"`
	// MetricsAddr serves the consumer's /metrics and health (default 127.0.0.1:9100).
	MetricsAddr string `yaml:"metrics_addr"`
	// Pprof serves Go's /debug/pprof/ on the consumer's metrics_addr
	// (LLMQ_PPROF): heap and CPU profiles of a running replica. Off by
	// default; the address is loopback unless metrics_addr says otherwise.
	Pprof bool `yaml:"pprof"`
	// GCHeapFloorMiB is the heap size below which the consumer and the
	// producer API do not start a garbage collection (internal/gcfloor):
	// 64 by default, negative for Go's default. An explicit GOGC wins.
	GCHeapFloorMiB int `yaml:"gc_heap_floor_mib"`
	// APIKeys maps bearer keys to tenants; "key:tenant,key:tenant" in LLMQ_API_KEYS.
	APIKeys APIKeys `yaml:"api_keys"`
	// AdminKeys are bearer keys that act for every tenant: they see every
	// tenant's jobs, backlog and usage and may read /metrics; comma-separated
	// in LLMQ_ADMIN_KEYS.
	AdminKeys []Secret `yaml:"admin_keys"`
	// Strategy is the default rate-control strategy for models that name none.
	Strategy string `yaml:"strategy"`

	// Provider is the single provider of configs without providers:, the
	// implicit provider "default" (providers.go).
	Provider Provider `yaml:"provider"`
	// Providers maps a name to a provider; each model names its own
	// (docs/design.md#providers). Keys: LLMQ_PROVIDERS_<NAME>_API_KEY.
	Providers    map[string]Provider `yaml:"providers"`
	Models       map[string]Model    `yaml:"models"`
	Worker       Worker              `yaml:"worker"`
	Backpressure Backpressure        `yaml:"backpressure"`
	Limits       Limits              `yaml:"limits"`
	Quota        Quota               `yaml:"quota"`
	Ingest       Ingest              `yaml:"ingest"`
	Reconciler   Reconciler          `yaml:"reconciler"`
	// Tenants maps a tenant name to its settings (results.go).
	Tenants  map[string]Tenant `yaml:"tenants"`
	Webhooks Webhooks          `yaml:"webhooks"`
	// Retention bounds how long finished jobs and their traces are kept (retention.go).
	Retention Retention `yaml:"retention"`
}

// APIKeys maps a bearer key to its tenant.
type APIKeys map[Secret]string

// ParseAPIKeys reads "key:tenant,key:tenant".
func ParseAPIKeys(s string) (APIKeys, error) {
	out := APIKeys{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		i := strings.LastIndex(pair, ":")
		if i <= 0 || i == len(pair)-1 {
			return nil, errors.New(`want "key:tenant" pairs separated by commas`)
		}
		out[Secret(pair[:i])] = pair[i+1:]
	}
	return out, nil
}

// UnmarshalYAML accepts either a mapping key→tenant or the env string form.
func (k *APIKeys) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		parsed, err := ParseAPIKeys(n.Value)
		if err != nil {
			return err
		}
		*k = parsed
		return nil
	}
	var m map[string]string
	if err := n.Decode(&m); err != nil {
		return err
	}
	*k = APIKeys{}
	for key, tenant := range m {
		(*k)[Secret(key)] = tenant
	}
	return nil
}

// Load reads path (may be empty: defaults only), applies the environment
// and defaults, and validates.
func Load(path string, env func(string) (string, bool)) (Config, error) {
	c := Config{Quota: Quota{Shared: true}}
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return c, fmt.Errorf("read config: %w", err)
		}
		if err := decodeYAML(data, &c); err != nil {
			return c, fmt.Errorf("config %s: %w", path, err)
		}
	}
	if env == nil {
		env = os.LookupEnv
	}
	if err := applyEnv(&c, env); err != nil {
		return c, err
	}
	c = c.WithDefaults()
	if err := c.ResolveSecrets(); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Parse is Load over bytes, for tests and embedded defaults.
func Parse(data []byte, env func(string) (string, bool)) (Config, error) {
	c := Config{Quota: Quota{Shared: true}}
	if err := decodeYAML(data, &c); err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	if env == nil {
		env = func(string) (string, bool) { return "", false }
	}
	if err := applyEnv(&c, env); err != nil {
		return c, err
	}
	c = c.WithDefaults()
	return c, c.Validate()
}

func decodeYAML(data []byte, c *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	// An empty file is an empty config.
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// WithDefaults fills every unset field with its documented default.
func (c Config) WithDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defDur := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defInt := func(i *int, v int) {
		if *i == 0 {
			*i = v
		}
	}
	def(&c.Broker, "rabbitmq")
	def(&c.HTTPAddr, "127.0.0.1:8080")
	def(&c.MetricsAddr, "127.0.0.1:9100")
	def(&c.Strategy, "auto")
	defInt(&c.GCHeapFloorMiB, 64)
	if c.AMQPURL == "" {
		c.AMQPURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	defDur(&c.PostgresTimeout, 15*time.Second)
	if c.Worker.ID == "" {
		host, _ := os.Hostname()
		c.Worker.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	defInt(&c.Worker.Prefetch, 64)
	defInt(&c.Worker.WeightHigh, 6)
	defInt(&c.Worker.WeightNormal, 3)
	defInt(&c.Worker.WeightLow, 1)
	defDur(&c.Worker.Lease, 60*time.Second)
	defInt(&c.Worker.FallbackAfter429, 2)
	defDur(&c.Worker.RetryBase, time.Second)
	defDur(&c.Worker.RetryMax, 5*time.Minute)
	defDur(&c.Worker.ShutdownGrace, 30*time.Second)
	defInt(&c.Worker.MaxInFlight, DefaultMaxInFlight)
	defInt(&c.Worker.TenantHold, max(c.Worker.Prefetch/4, 1))
	defInt(&c.Ingest.Prefetch, 1000)
	defDur(&c.Reconciler.Interval, time.Second)
	defDur(&c.Reconciler.LostAfter, 30*time.Second)
	if c.Backpressure.SoftLimit == 0 {
		c.Backpressure.SoftLimit = 10000
	}
	if c.Backpressure.HardLimit == 0 {
		c.Backpressure.HardLimit = 50000
	}
	defDur(&c.Backpressure.StatusInterval, 5*time.Second)
	defInt(&c.Limits.MaxPayloadBytes, 1<<20)
	defInt(&c.Limits.MaxOutputTokens, 131072)
	defDur(&c.Quota.LeaseTTL, 10*time.Second)
	if c.Quota.FailClosed {
		c.Quota.FallbackShare = 0
	} else if c.Quota.FallbackShare == 0 {
		c.Quota.FallbackShare = 0.25
	}
	c.Webhooks.withDefaults()
	c.Kafka.withDefaults()
	c.Retention.withDefaults()
	for name, m := range c.Models {
		if m.Strategy == "" {
			m.Strategy = c.Strategy
		}
		m.Batch.withDefaults()
		c.Models[name] = m
	}
	c.providersWithDefaults()
	return c
}

// ResolveSecrets reads the keys and secrets kept in files (api_key_file,
// password_file, webhook_secret_file).
func (c *Config) ResolveSecrets() error {
	if err := c.resolveTenantSecrets(); err != nil {
		return err
	}
	if err := c.resolveKafkaSecrets(); err != nil {
		return err
	}
	return c.resolveProviderKeys()
}

// DefaultMaxInFlight is worker.max_in_flight's default: about a second of
// what one replica runs against a quick model on two cores, so that a
// one-tenant flood is held, not parked, while its group's hold (a second
// of its admissions) is under it. At 1,000 most of such a flood was
// parked and written twice; at 4,000 under a tenth, and llmq ran 15-36%
// faster (BENCHMARKS.md, "Held, not parked"). Memory: 4,000 calls in
// flight took 117 MB RSS with 1 KB requests; a replica holds up to this
// many requests, so large payloads want a lower figure.
const DefaultMaxInFlight = 4000

// MinKeyLength is the shortest API or admin key accepted: a short key can
// be guessed by anyone who can reach the API.
const MinKeyLength = 20

var strategies = map[string]bool{"retry": true, "ratelimit": true, "shaping": true, "adaptive": true, "auto": true}

// KnownCapabilities are what a fallback model may declare and a job may need.
var KnownCapabilities = map[string]bool{"tools": true, "json_schema": true, "json_object": true, "vision": true}

// Validate reports the first invalid setting, naming its key.
func (c Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("config: %s: %s", key, fmt.Sprintf(format, args...))
	}
	switch c.Broker {
	case "rabbitmq":
	case "kafka":
		if len(c.KafkaBrokers) == 0 {
			return bad("kafka_brokers", "required when broker is kafka")
		}
	default:
		return bad("broker", "must be rabbitmq or kafka, got %q", c.Broker)
	}
	for key, addr := range map[string]string{"http_addr": c.HTTPAddr, "metrics_addr": c.MetricsAddr} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return bad(key, "must be host:port, got %q", addr)
		}
	}
	if !strategies[c.Strategy] {
		return bad("strategy", "must be one of retry, ratelimit, shaping, adaptive, auto; got %q", c.Strategy)
	}
	if err := c.validateProviders(); err != nil {
		return err
	}
	for tenantKey, tenant := range c.APIKeys {
		if tenantKey == "" || tenant == "" {
			return bad("api_keys", "every entry needs a key and a tenant")
		}
		if len(tenantKey) < MinKeyLength {
			// Name the tenant, never the key.
			return bad("api_keys", "the key of tenant %q is shorter than %d characters", tenant, MinKeyLength)
		}
	}
	for i, k := range c.AdminKeys {
		if len(k) < MinKeyLength {
			return bad("admin_keys", "admin key #%d is shorter than %d characters", i+1, MinKeyLength)
		}
	}
	if err := c.validateKafka(); err != nil {
		return err
	}
	names := make([]string, 0, len(c.Models))
	for name := range c.Models {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		m := c.Models[name]
		key := "models." + name
		if m.RPM < 0 || m.TPM < 0 || m.RPS < 0 || m.TPS < 0 || m.MaxConcurrency < 0 {
			return bad(key, "limits must not be negative")
		}
		if !strategies[m.Strategy] {
			return bad(key+".strategy", "must be one of retry, ratelimit, shaping, adaptive, auto; got %q", m.Strategy)
		}
		for _, f := range m.Fallback {
			if f == name {
				return bad(key+".fallback", "a model cannot fall back to itself")
			}
			if _, ok := c.Models[f]; !ok {
				return bad(key+".fallback", "names %q, which is not under models:", f)
			}
		}
		if err := m.Batch.validate(key + ".batch"); err != nil {
			return err
		}
		if err := c.validateModelKind(name); err != nil {
			return err
		}
		for _, cap := range m.Capabilities {
			if !KnownCapabilities[cap] {
				return bad(key+".capabilities", "unknown capability %q (known: json_object, json_schema, tools, vision)", cap)
			}
		}
	}
	w := c.Worker
	if w.Prefetch < 1 || w.WeightHigh < 1 || w.WeightNormal < 1 || w.WeightLow < 1 || w.MaxInFlight < 1 {
		return bad("worker", "prefetch, weights and max_in_flight must be positive")
	}
	if w.StoreDelay > time.Second {
		return bad("worker.store_delay", "at most 1s: a job read off the intake has its row within about a second")
	}
	if c.Backpressure.SoftLimit > c.Backpressure.HardLimit {
		return bad("backpressure.soft_limit", "must not exceed hard_limit")
	}
	if c.Quota.FallbackShare < 0 || c.Quota.FallbackShare > 1 {
		return bad("quota.fallback_share", "must be between 0 and 1")
	}
	if err := c.validateResults(); err != nil {
		return err
	}
	if err := c.validateRetention(); err != nil {
		return err
	}
	if err := c.Limits.validateRequestFields(); err != nil {
		return err
	}
	return c.validateTenantLimits()
}

// GCHeapFloor is GCHeapFloorMiB in bytes; 0 when it is negative (off).
func (c Config) GCHeapFloor() uint64 {
	if c.GCHeapFloorMiB <= 0 {
		return 0
	}
	return uint64(c.GCHeapFloorMiB) << 20
}
