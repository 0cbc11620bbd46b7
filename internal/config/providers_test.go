package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const twoProviders = `
providers:
  dashscope:
    base_url: https://dashscope.example/compatible-mode/v1
    native_base_url: https://dashscope.example/api/v1
    api_key: sk-dash-0000
    dialect: dashscope
    wait_timeout: 10s
  openai-eu:
    base_url: https://gateway.example/v1
    headers: {OpenAI-Project: proj-secret-77}
models:
  qwen-plus:
    provider: dashscope
    rpm: 600
    fallback: [qwen-plus-eu]
  qwen-plus-eu:
    provider: openai-eu
    upstream: qwen-plus
    rpm: 60
`

func TestLegacyConfigIsTheDefaultProvider(t *testing.T) {
	c, err := Parse([]byte(sample), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := c.Models["qwen-plus"]
	if m.Provider != DefaultProvider || m.Upstream != "qwen-plus" {
		t.Fatalf("route of a legacy model: %q %q", m.Provider, m.Upstream)
	}
	// The quota key stays the model's name: rows written before providers:
	// existed, and replicas still running the old version, share it.
	if k := c.QuotaKey("qwen-plus"); k != "qwen-plus" {
		t.Fatalf("quota key %q", k)
	}
	set := c.ProviderSet()
	if len(set) != 1 || set[DefaultProvider].BaseURL != "http://127.0.0.1:9000/v1" || set[DefaultProvider].WaitTimeout != 30*time.Second ||
		set[DefaultProvider].Timeout != 120*time.Second || set[DefaultProvider].Dialect != DialectOpenAI {
		t.Fatalf("provider set: %+v", set)
	}
	if got := c.ProvidersInUse(); !slices.Equal(got, []string{DefaultProvider}) {
		t.Fatalf("in use: %v", got)
	}
	// A model missing from models: goes to the default provider by name.
	if r := c.Route("qwen-max"); r != (Route{Provider: DefaultProvider, Upstream: "qwen-max"}) {
		t.Fatalf("route of an unlisted model: %+v", r)
	}
}

func TestProvidersMap(t *testing.T) {
	c, err := Parse([]byte(twoProviders), envMap(map[string]string{
		"LLMQ_PROVIDERS_OPENAI_EU_API_KEY": "sk-eu-1111",
		"LLMQ_PROVIDERS_OPENAI_EU_TIMEOUT": "30s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	eu := c.Providers["openai-eu"]
	if eu.APIKey.Reveal() != "sk-eu-1111" || eu.Timeout != 30*time.Second || eu.Dialect != DialectOpenAI ||
		eu.Headers["OpenAI-Project"].Reveal() != "proj-secret-77" {
		t.Fatalf("openai-eu: %+v", eu)
	}
	if ds := c.Providers["dashscope"]; ds.Timeout != 120*time.Second || ds.APIKey.Reveal() != "sk-dash-0000" {
		t.Fatalf("dashscope: %+v", ds)
	}
	if r := c.Route("qwen-plus-eu"); r != (Route{Provider: "openai-eu", Upstream: "qwen-plus"}) {
		t.Fatalf("route %+v", r)
	}
	// One upstream model on two providers: two quotas.
	if a, b := c.QuotaKey("qwen-plus"), c.QuotaKey("qwen-plus-eu"); a != "dashscope/qwen-plus" || b != "openai-eu/qwen-plus" {
		t.Fatalf("quota keys %q %q", a, b)
	}
	if got := c.ProvidersInUse(); !slices.Equal(got, []string{"dashscope", "openai-eu"}) {
		t.Fatalf("in use: %v", got)
	}
}

func TestProvidersBesideTheLegacySection(t *testing.T) {
	c, err := Parse([]byte(sample+`  qwen-eu: {provider: eu, upstream: qwen-plus}
providers:
  eu: {base_url: "https://eu.example/v1"}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ProvidersInUse(); !slices.Equal(got, []string{DefaultProvider, "eu"}) {
		t.Fatalf("in use: %v", got)
	}
	if k := c.QuotaKey("qwen-eu"); k != "eu/qwen-plus" {
		t.Fatalf("quota key %q", k)
	}
}

func TestProvidersInvalid(t *testing.T) {
	cases := []struct{ yaml, key string }{
		{"models:\n  a: {provider: nowhere}\n", "models.a.provider"},
		{"providers:\n  p: {base_url: 'http://x/v1'}\nmodels:\n  a: {provider: p, upstream: m}\n  b: {provider: p, upstream: m}\n", "models.b"},
		{"providers:\n  p: {api_key: k}\n", "providers.p.base_url"},
		{"providers:\n  p: {base_url: 'ftp://x'}\n", "providers.p.base_url"},
		{"providers:\n  p: {base_url: 'http://x/v1', dialect: anthropic}\n", "providers.p.dialect"},
		{"providers:\n  p: {base_url: 'http://x/v1', native_base_url: 'http://x/api/v1'}\n", "providers.p.native_base_url"},
		{"providers:\n  p: {base_url: 'http://x/v1', timeout: -1s}\n", "providers.p.timeout"},
		{"providers:\n  p: {base_url: 'http://x/v1', headers: {authorization: x}}\n", "providers.p.headers.authorization"},
		{"providers:\n  p: {base_url: 'http://x/v1', headers: {'bad header': x}}\n", "providers.p.headers"},
		{"providers:\n  'p.q': {base_url: 'http://x/v1'}\n", "providers.p.q"},
		{"providers:\n  a-b: {base_url: 'http://x/v1'}\n  a_b: {base_url: 'http://y/v1'}\n", "providers.a_b"},
		{"provider: {base_url: 'http://x/v1'}\nproviders:\n  default: {base_url: 'http://y/v1'}\n", "providers.default"},
		{"provider: {dialect: soap}\n", "provider.dialect"},
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.yaml), nil)
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%q: got %v, want an error naming %s", tc.yaml, err, tc.key)
		}
	}
}

func TestProviderSecretsNeverPrinted(t *testing.T) {
	const key, header = "sk-provider-secret-42", "proj-secret-77"
	c, err := Parse([]byte(twoProviders), envMap(map[string]string{"LLMQ_PROVIDERS_DASHSCOPE_API_KEY": key}))
	if err != nil {
		t.Fatal(err)
	}
	requirePrintsNone(t, c, key, header)
	_, err = Parse([]byte(twoProviders), envMap(map[string]string{"LLMQ_PROVIDERS_DASHSCOPE_TIMEOUT": key}))
	if err == nil || strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "LLMQ_PROVIDERS_DASHSCOPE_TIMEOUT") {
		t.Fatalf("bad value: %v", err)
	}
}

func TestLoadReadsProviderKeyFiles(t *testing.T) {
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "key")
	if err := os.WriteFile(keyPath, []byte("sk-eu-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "llmq.yaml")
	yaml := "providers:\n  eu: {base_url: 'https://eu.example/v1', api_key_file: " + keyPath + "}\n"
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(cfgPath, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Providers["eu"].APIKey.Reveal(); got != "sk-eu-from-file" {
		t.Fatalf("key %q", got)
	}
	missing := "providers:\n  eu: {base_url: 'https://eu.example/v1', api_key_file: " + filepath.Join(dir, "nope") + "}\n"
	if err := os.WriteFile(cfgPath, []byte(missing), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(cfgPath, envMap(nil)); err == nil || !strings.Contains(err.Error(), "providers.eu.api_key_file") {
		t.Fatalf("missing key file: %v", err)
	}
}
