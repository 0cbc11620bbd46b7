package sim

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const fullYAML = `
dialect: dashscope
api_keys: [sk-a]
headers: {retry_after: true, rate_limit: true}
latency: {ttft: 200ms, tpt: 0.02, capacity: 8}
output: {short: 20, long: 400, long_share: 0.25}
faults: {seed: 3, error_rate: 0.01, timeout_rate: 0.001, timeout: 30s, reset_rate: 0.001}
models:
  qwen-plus:
    rpm: 600
    tpm: 90000
    rps: 0
    tps: 0
    max_concurrency: 20
    fallback: [qwen-flash]
    capabilities: [tools, json_schema]
    burst: {floor: 10, growth: 2, window: 10s, token_floor: 5000}
    max_response_time: 120s
  qwen-flash:
    rpm: 1200
    output: {short: 5, long: 50, long_share: 0.5}
`

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(fullYAML))
	require.NoError(t, err)
	require.Equal(t, DialectDashScope, c.Dialect)
	require.Equal(t, 200*time.Millisecond, c.Latency.TTFT.D())
	require.Equal(t, 20*time.Millisecond, c.Latency.TPT.D())
	p := c.Models["qwen-plus"]
	require.Equal(t, int64(600), p.RPM)
	require.Equal(t, BurstConfig{Floor: 10, Growth: 2, Window: Duration(10 * time.Second), TokenFloor: 5000}, p.Burst)
	require.Equal(t, 120*time.Second, p.MaxResponseTime.D())
	require.Equal(t, 300*time.Second, c.Models["qwen-flash"].MaxResponseTime.D())
	require.Equal(t, int64(50), c.Models["qwen-flash"].Output.Long)

	path := filepath.Join(t.TempDir(), "sim.yaml")
	require.NoError(t, os.WriteFile(path, []byte(fullYAML), 0o600))
	c2, err := LoadConfig(path)
	require.NoError(t, err)
	require.Equal(t, c, c2)
	_, err = LoadConfig(filepath.Join(t.TempDir(), "missing.yaml"))
	require.ErrorContains(t, err, "missing.yaml")
}

func TestParseConfigErrorsNameTheKey(t *testing.T) {
	for yaml, key := range map[string]string{
		"models: {m: {rpm: 1, rpmm: 2}}":                "rpmm",
		"dialect: grpc\nmodels: {m: {}}":                "dialect",
		"models: {m: {rpm: -5}}":                        "models.m.rpm",
		"models: {m: {burst: {growth: 0.5, floor: 1}}}": "models.m.burst.growth",
		"models: {m: {burst: {growth: 2}}}":             "models.m.burst.floor",
		"models: {m: {latency: {ttft: soon}}}":          "invalid duration",
		"faults: {error_rate: 2}\nmodels: {m: {}}":      "faults.error_rate",
		"output: {short: 0, long: 5}\nmodels: {m: {}}":  "output.short",
		"": "models",
		"models: {m: {output: {short: 1, long: 1, long_share: 3}}}": "models.m.output.long_share",
	} {
		_, err := ParseConfig([]byte(yaml))
		require.ErrorContains(t, err, key, "yaml %q", yaml)
	}
}

func TestDefaultConfigIsValid(t *testing.T) {
	c := DefaultConfig()
	require.NoError(t, c.Validate())
	require.Contains(t, c.Models, "qwen-plus")
}
