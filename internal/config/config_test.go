package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

const sample = `
postgres_url: postgres://x@db/llmq
broker: rabbitmq
api_keys:
  key-support-0123456789: support
provider:
  base_url: http://127.0.0.1:9000/v1
  wait_timeout: 30s
models:
  qwen-plus:
    rpm: 600
    tpm: 1000000
    max_concurrency: 20
    fallback: [qwen-flash]
    capabilities: [tools, json_schema]
  qwen-flash:
    rpm: 1200
    tpm: 2000000
    capabilities: [tools]
`

func TestParseSampleWithDefaults(t *testing.T) {
	c, err := Parse([]byte(sample), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != "127.0.0.1:8080" || c.MetricsAddr != "127.0.0.1:9100" || c.Strategy != "auto" {
		t.Fatalf("defaults: %+v", c)
	}
	if c.Models["qwen-plus"].Strategy != "auto" || c.Models["qwen-plus"].RPM != 600 || c.Provider.WaitTimeout != 30*time.Second {
		t.Fatalf("models: %+v", c.Models)
	}
	if c.APIKeys["key-support-0123456789"] != "support" {
		t.Fatalf("api keys: %v", c.APIKeys)
	}
}

func TestEnvOverridesEveryKind(t *testing.T) {
	c, err := Parse([]byte(sample), envMap(map[string]string{
		"LLMQ_BROKER":                  "kafka",
		"LLMQ_KAFKA_BROKERS":           "a:9092, b:9092",
		"LLMQ_HTTP_ADDR":               "0.0.0.0:8081",
		"LLMQ_PROVIDER_BASE_URL":       "https://dashscope.example/compatible-mode/v1",
		"LLMQ_PROVIDER_API_KEY":        "sk-secret",
		"LLMQ_PROVIDER_TIMEOUT":        "90s",
		"LLMQ_PROVIDER_STREAM":         "true",
		"LLMQ_API_KEYS":                "key-a-0123456789abcd:t1,key-b:c-0123456789ab:t2",
		"LLMQ_STRATEGY":                "shaping",
		"LLMQ_WORKER_PREFETCH":         "7",
		"LLMQ_BACKPRESSURE_HARD_LIMIT": "99",
		"LLMQ_BACKPRESSURE_SOFT_LIMIT": "9",
		"LLMQ_QUOTA_FALLBACK_SHARE":    "0.5",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Broker != "kafka" || strings.Join(c.KafkaBrokers, "|") != "a:9092|b:9092" || c.HTTPAddr != "0.0.0.0:8081" ||
		c.Provider.APIKey.Reveal() != "sk-secret" || c.Provider.Timeout != 90*time.Second || !c.Provider.Stream ||
		c.APIKeys["key-a-0123456789abcd"] != "t1" || c.APIKeys["key-b:c-0123456789ab"] != "t2" || c.Strategy != "shaping" || c.Worker.Prefetch != 7 ||
		c.Backpressure.HardLimit != 99 || c.Quota.FallbackShare != 0.5 {
		t.Fatalf("overrides not applied: %+v", c)
	}
	// A model that names no strategy inherits the overridden default.
	if c.Models["qwen-flash"].Strategy != "shaping" {
		t.Fatalf("model strategy %q", c.Models["qwen-flash"].Strategy)
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	cases := []struct {
		yaml string
		env  map[string]string
		key  string
	}{
		{"broker: nats\n", nil, "broker"},
		{"broker: kafka\n", nil, "kafka_brokers"},
		{"strategy: yolo\n", nil, "strategy"},
		{"http_addr: nope\n", nil, "http_addr"},
		{"provider:\n  base_url: ftp://x\n", nil, "provider.base_url"},
		{"models:\n  a:\n    rpm: -1\n", nil, "models.a"},
		{"models:\n  a:\n    fallback: [b]\n", nil, "models.a.fallback"},
		{"models:\n  a:\n    fallback: [a]\n", nil, "models.a.fallback"},
		{"models:\n  a:\n    capabilities: [telepathy]\n", nil, "models.a.capabilities"},
		{"models:\n  a:\n    strategy: fast\n", nil, "models.a.strategy"},
		{"backpressure:\n  soft_limit: 10\n  hard_limit: 5\n", nil, "backpressure.soft_limit"},
		{"quota:\n  fallback_share: 2\n", nil, "quota.fallback_share"},
		{"unknown_key: 1\n", nil, "unknown_key"},
		{"", map[string]string{"LLMQ_WORKER_PREFETCH": "many"}, "LLMQ_WORKER_PREFETCH"},
		{"", map[string]string{"LLMQ_PROVIDER_TIMEOUT": "soon"}, "provider.timeout"},
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.yaml), envMap(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%q %v: got %v, want an error naming %s", tc.yaml, tc.env, err, tc.key)
		}
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	const key = "sk-very-secret-123"
	c, err := Parse([]byte(sample), envMap(map[string]string{"LLMQ_PROVIDER_API_KEY": key, "LLMQ_AMQP_URL": "amqp://u:" + key + "@h/"}))
	if err != nil {
		t.Fatal(err)
	}
	requirePrintsNone(t, c, key)
	// A bad value for a secret variable is reported without the value.
	_, err = Parse(nil, envMap(map[string]string{"LLMQ_PROVIDER_TIMEOUT": key}))
	if err == nil || strings.Contains(err.Error(), key) {
		t.Fatalf("error leaks value: %v", err)
	}
}

func TestLoadReadsKeyFile(t *testing.T) {
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "key")
	if err := os.WriteFile(keyPath, []byte("sk-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "llmq.yaml")
	if err := os.WriteFile(cfgPath, []byte("provider:\n  api_key_file: "+keyPath+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(cfgPath, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Provider.APIKey.Reveal() != "sk-from-file" {
		t.Fatalf("key %q", c.Provider.APIKey.Reveal())
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml"), envMap(nil)); err == nil {
		t.Fatal("missing file accepted")
	}
}

func TestEnvNamesCoverContract(t *testing.T) {
	names := strings.Join(EnvNames(), " ")
	for _, want := range []string{"LLMQ_POSTGRES_URL", "LLMQ_BROKER", "LLMQ_AMQP_URL", "LLMQ_KAFKA_BROKERS", "LLMQ_HTTP_ADDR",
		"LLMQ_METRICS_ADDR", "LLMQ_PROVIDER_BASE_URL", "LLMQ_PROVIDER_API_KEY", "LLMQ_API_KEYS", "LLMQ_STRATEGY"} {
		if !strings.Contains(names, want+" ") && !strings.HasSuffix(names, want) {
			t.Errorf("EnvNames misses %s", want)
		}
	}
}

func TestQuotaFailClosed(t *testing.T) {
	c, err := Parse([]byte("quota:\n  fail_closed: true\n"), nil)
	if err != nil || c.Quota.FallbackShare != 0 {
		t.Fatalf("fail_closed: share %v, %v", c.Quota.FallbackShare, err)
	}
	c, err = Parse(nil, envMap(map[string]string{"LLMQ_QUOTA_FAIL_CLOSED": "true"}))
	if err != nil || c.Quota.FallbackShare != 0 {
		t.Fatalf("LLMQ_QUOTA_FAIL_CLOSED: share %v, %v", c.Quota.FallbackShare, err)
	}
	c, err = Parse(nil, nil)
	if err != nil || c.Quota.FallbackShare != 0.25 {
		t.Fatalf("default share %v, %v", c.Quota.FallbackShare, err)
	}
}

// requirePrintsNone fails when any way of printing c (fmt, JSON, slog)
// shows one of secrets.
func requirePrintsNone(t *testing.T, c Config, secrets ...string) {
	t.Helper()
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("config", "config", c, "key", c.Provider.APIKey, "providers", c.Providers)
	js, _ := json.Marshal(c)
	for name, out := range map[string]string{
		"%v": fmt.Sprintf("%v", c), "%+v": fmt.Sprintf("%+v", c), "%#v": fmt.Sprintf("%#v", c),
		"json": string(js), "slog": logs.String(),
	} {
		for _, s := range secrets {
			if strings.Contains(out, s) {
				t.Errorf("%s printed a secret: %s", name, out)
			}
		}
	}
}

func TestGCHeapFloor(t *testing.T) {
	c, err := Parse(nil, nil)
	if err != nil || c.GCHeapFloor() != 64<<20 {
		t.Fatalf("default floor %d bytes, %v; want 64 MiB", c.GCHeapFloor(), err)
	}
	c, err = Parse(nil, envMap(map[string]string{"LLMQ_GC_HEAP_FLOOR_MIB": "256"}))
	if err != nil || c.GCHeapFloor() != 256<<20 {
		t.Fatalf("LLMQ_GC_HEAP_FLOOR_MIB=256: %d bytes, %v", c.GCHeapFloor(), err)
	}
	c, err = Parse([]byte("gc_heap_floor_mib: -1\n"), nil)
	if err != nil || c.GCHeapFloor() != 0 {
		t.Fatalf("gc_heap_floor_mib: -1: %d bytes, %v; want 0 (off)", c.GCHeapFloor(), err)
	}
}
