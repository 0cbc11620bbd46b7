package worker

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
)

func publish(t testing.TB, p broker.Publisher, lane job.Priority, id string, body []byte) {
	t.Helper()
	require.NoError(t, p.Publish(context.Background(), lane, broker.Message{Key: id, Body: body}))
}

// readDeadLetters waits for n envelopes on the broker's DLQ.
func readDeadLetters(t *testing.T, r broker.DeadLetterReader, n int) []broker.DeadLetter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []broker.DeadLetter
	for len(out) < n {
		dls, err := r.ReadDeadLetters(ctx, n-len(out))
		require.NoError(t, err, "got %d of %d dead letters", len(out), n)
		out = append(out, dls...)
	}
	return out
}

func TestMemoryEndToEnd(t *testing.T) {
	t.Parallel()
	models := map[string]config.Model{"qwen-plus": {RPM: 60000, TPM: 6_000_000, Warmup: -1}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"qwen-plus": {RPM: 60000, TPM: 6_000_000}},
		Faults: sim.FaultConfig{Seed: 7, ErrorRate: 0.05}}, models)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	pub := mem.Publisher()
	bodies := map[string][]byte{}
	for i := range 300 {
		id := fmt.Sprintf("e2e-%d", i)
		bodies[id] = jobBody(id, "qwen-plus", i, map[string]any{"tenant": nil})
		delete(bodies, "")
		publish(t, pub, laneOf(i), id, jobBody(id, "qwen-plus", i, nil))
		bodies[id] = jobBody(id, "qwen-plus", i, nil)
	}
	h.start(mem.Subscriber(), h.cfg)
	got := h.wait(300, 60*time.Second)
	require.Equal(t, map[string]int{"succeeded": 300}, got)
	h.checkResults(context.Background(), bodies)

	// A redelivered job whose result exists is acked without a call.
	before := h.sim.Stats().Models["qwen-plus"].Requests
	publish(t, pub, job.PriorityNormal, "e2e-1", bodies["e2e-1"])
	publish(t, pub, job.PriorityNormal, "sentinel", jobBody("sentinel", "qwen-plus", 1, nil))
	require.Equal(t, map[string]int{"succeeded": 1}, h.wait(1, 30*time.Second))
	require.Equal(t, before+1, h.sim.Stats().Models["qwen-plus"].Requests, "only the sentinel reached the provider")
}

func TestMalformedAndPoison(t *testing.T) {
	t.Parallel()
	models := map[string]config.Model{"qwen-plus": {}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"qwen-plus": {}}}, models)
	h.cfg.Limits = job.Limits{MaxPayloadBytes: 4096}
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	pub := mem.Publisher()
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	msgs := map[string]struct {
		body   []byte
		reason string
	}{
		"json":      {[]byte(`{"id":"x1",`), "truncated"},
		"type":      {[]byte(`{"id":"x2","model":42,"request":{}}`), "model"},
		"utf8":      {[]byte("{\"id\":\"x3\",\"model\":\"qwen-plus\",\"request\":{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}}"), "UTF-8"},
		"oversize":  {[]byte(`{"id":"x4","model":"qwen-plus","request":{"messages":[{"role":"user","content":"` + strings.Repeat("a", 5000) + `"}]}}`), "byte limit"},
		"maxtokens": {[]byte(`{"id":"x5","model":"qwen-plus","request":{"messages":[{"role":"user","content":"a"}],"max_tokens":99999999}}`), "max_tokens"},
		"unknown":   {[]byte(`{"id":"x6","model":"gpt-9","request":{"messages":[{"role":"user","content":"a"}]}}`), "not a configured model"},
		"noid":      {[]byte(`{"model":"qwen-plus","request":{"messages":[{"role":"user","content":"a"}]}}`), "id"},
		"deadline":  {[]byte(`{"id":"x8","model":"qwen-plus","deadline":"` + past + `","request":{"messages":[{"role":"user","content":"a"}]}}`), "deadline passed"},
	}
	for name, m := range msgs {
		publish(t, pub, job.PriorityLow, name, m.body)
	}
	h.start(mem.Subscriber(), h.cfg)
	require.Equal(t, map[string]int{"dead": len(msgs)}, h.wait(len(msgs), 30*time.Second))

	dls := readDeadLetters(t, mem, len(msgs))
	byBody := map[string]broker.DeadLetter{}
	for _, dl := range dls {
		byBody[string(dl.Body)] = dl
	}
	for name, m := range msgs {
		dl, ok := byBody[string(m.body)]
		require.True(t, ok, "%s: body kept byte for byte", name)
		require.Contains(t, dl.Reason, m.reason, name)
		require.Equal(t, job.PriorityLow, dl.Lane)
	}
	rows, _, err := h.store.ListDeadLetters(context.Background(), job.DefaultTenant, "", 100)
	require.NoError(t, err)
	require.Len(t, rows, len(msgs))
	rec, err := h.store.Get(context.Background(), job.Key{Tenant: job.DefaultTenant, ID: "x8"})
	require.NoError(t, err)
	require.Equal(t, job.StatusDead, rec.Status)
	require.Zero(t, h.sim.Stats().Models["qwen-plus"].Requests, "nothing malformed reached the provider")
}

func TestPermanent4xxFailsWithoutRetry(t *testing.T) {
	t.Parallel()
	// No models: configured, so the job is accepted and the provider
	// answers 404 model_not_found.
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"qwen-plus": {}}}, nil)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	publish(t, mem.Publisher(), job.PriorityHigh, "bad-model", jobBody("bad-model", "no-such-model", 1, nil))
	h.start(mem.Subscriber(), h.cfg)
	require.Equal(t, map[string]int{"failed": 1}, h.wait(1, 30*time.Second))
	rec, err := h.store.Get(context.Background(), job.Key{Tenant: job.DefaultTenant, ID: "bad-model"})
	require.NoError(t, err)
	require.Equal(t, job.StatusFailed, rec.Status)
	require.Equal(t, 1, rec.Attempts)
	require.Len(t, rec.Errors, 1)
	require.Equal(t, "client", rec.Errors[0].Kind)
	require.Empty(t, mem.DeadLetters())
}

func TestFallbackOnRateLimit(t *testing.T) {
	t.Parallel()
	models := map[string]config.Model{
		// The retry strategy admits everything, so the primary's 429s are real.
		"primary": {Strategy: "retry", Fallback: []string{"plain", "capable"}},
		"plain":   {Strategy: "retry"},
		"capable": {Strategy: "retry", Capabilities: []string{"tools"}},
	}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{
		"primary": {RPM: 1}, // permanently limited after its first request
		"plain":   {},
		"capable": {},
	}}, models)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	pub := mem.Publisher()
	// Use up the primary's one request per minute.
	publish(t, pub, job.PriorityHigh, "warm", jobBody("warm", "primary", 1, nil))
	h.start(mem.Subscriber(), h.cfg)
	require.Equal(t, map[string]int{"succeeded": 1}, h.wait(1, 30*time.Second))

	publish(t, pub, job.PriorityNormal, "plain-job", jobBody("plain-job", "primary", 2, nil))
	publish(t, pub, job.PriorityNormal, "tools-job", jobBody("tools-job", "primary", 3, map[string]any{
		"request": map[string]any{"messages": []map[string]string{{"role": "user", "content": "call"}}, "tools": []map[string]any{{"type": "function", "function": map[string]string{"name": "f"}}}},
	}))
	publish(t, pub, job.PriorityNormal, "own-chain", jobBody("own-chain", "primary", 4, map[string]any{"fallback_models": []string{"capable"}}))
	require.Equal(t, map[string]int{"succeeded": 3}, h.wait(3, 60*time.Second))
	ctx := context.Background()
	for id, want := range map[string]string{"plain-job": "plain", "tools-job": "capable", "own-chain": "capable"} {
		rec, err := h.store.Get(ctx, job.Key{Tenant: job.DefaultTenant, ID: id})
		require.NoError(t, err)
		require.Equal(t, want, rec.ModelUsed, id)
		require.Len(t, rec.Errors, 2, "%s: two 429s on the primary, then the fallback", id)
		for _, e := range rec.Errors {
			require.Equal(t, "primary", e.Model)
			require.True(t, isRateLimitKind(e.Kind), e.Kind)
		}
	}
}

func TestFallbackLackingCapabilityNotUsed(t *testing.T) {
	t.Parallel()
	models := map[string]config.Model{
		"primary": {Strategy: "retry", Fallback: []string{"plain"}},
		"plain":   {Strategy: "retry"},
	}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"primary": {RPM: 1}, "plain": {}}}, models)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	pub := mem.Publisher()
	publish(t, pub, job.PriorityHigh, "warm", jobBody("warm", "primary", 1, nil))
	h.start(mem.Subscriber(), h.cfg)
	require.Equal(t, map[string]int{"succeeded": 1}, h.wait(1, 30*time.Second))
	publish(t, pub, job.PriorityNormal, "schema-job", jobBody("schema-job", "primary", 2, map[string]any{
		"max_attempts": 3,
		"request":      map[string]any{"messages": []map[string]string{{"role": "user", "content": "x"}}, "response_format": map[string]string{"type": "json_schema"}},
	}))
	require.Equal(t, map[string]int{"dead": 1}, h.wait(1, 60*time.Second))
	rec, err := h.store.Get(context.Background(), job.Key{Tenant: job.DefaultTenant, ID: "schema-job"})
	require.NoError(t, err)
	require.Equal(t, job.StatusDead, rec.Status)
	for _, e := range rec.Errors {
		require.Equal(t, "primary", e.Model, "never sent to a model lacking json_schema")
	}
	require.Zero(t, h.sim.Stats().Models["plain"].Requests)
	dls := readDeadLetters(t, mem, 1)
	// 429s do not use up max_attempts: the job is dead after
	// RateLimitAttemptFactor (4) × max_attempts (3) rate-limited calls.
	require.Equal(t, 12, dls[0].Attempts)
	require.Len(t, rec.Errors, 12)
	require.NotEmpty(t, dls[0].LastError)
	require.False(t, dls[0].FirstFailedAt.IsZero())
}

func TestShutdownHandsBackAndNothingIsLost(t *testing.T) {
	t.Parallel()
	models := map[string]config.Model{"slow": {Strategy: "retry"}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"slow": {
		Latency: &sim.LatencyConfig{TTFT: sim.Duration(time.Hour)}}}}, models)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	pub := mem.Publisher()
	const n = 20
	bodies := map[string][]byte{}
	for i := range n {
		id := fmt.Sprintf("sd-%d", i)
		bodies[id] = jobBody(id, "slow", i, nil)
		publish(t, pub, laneOf(i), id, bodies[id])
	}
	cfg := h.cfg
	cfg.ShutdownGrace = 50 * time.Millisecond
	sub := mem.Subscriber()
	entered := &enteredProvider{Provider: h.prov, entered: make(chan struct{}, n)}
	h.call = entered
	_, stop := h.start(sub, cfg)
	// Wait until every job is in flight at the provider.
	timeout := time.After(30 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case <-entered.entered:
		case <-timeout:
			t.Fatalf("only %d of %d jobs reached the provider", i, n)
		}
	}
	stop()
	h.call = h.prov
	require.NoError(t, sub.Close())
	ctx := context.Background()
	for id := range bodies {
		rec, err := h.store.Get(ctx, job.Key{Tenant: job.DefaultTenant, ID: id})
		require.NoError(t, err)
		require.Equal(t, job.StatusQueued, rec.Status, id)
	}
	// A new worker against a fast provider finishes every handed-back job.
	require.NoError(t, h.sim.SetModel("slow", sim.ModelConfig{}))
	h.start(mem.Subscriber(), h.cfg)
	require.Equal(t, map[string]int{"succeeded": n}, h.wait(n, 60*time.Second))
	h.checkResults(ctx, bodies)
}
