package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/launch"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// Keys and models of the console test's stack.
const (
	consoleAcmeKey   = "acme-console-key-0123456789"
	consoleGlobexKey = "globex-console-key-9876543210"
	consoleAdminKey  = "admin-console-key-5555555555"
	// consoleSlow answers after consoleSlowTTFT: a job of it is seen
	// running before it succeeds.
	consoleSlow     = "qwen-plus"
	consoleSlowTTFT = 3 * time.Second
	// consoleFast carries the load of the overview.
	consoleFast = "qwen-flash"
)

// consoleStack is a producer and two consumer replicas running in this
// process against real Postgres and RabbitMQ and an in-process llmsim.
type consoleStack struct {
	t       *testing.T
	cfg     config.Config
	baseURL string
	ctx     context.Context
	wg      sync.WaitGroup
}

func newConsoleStack(t *testing.T) *consoleStack {
	t.Helper()
	slow := sim.LatencyConfig{TTFT: sim.Duration(consoleSlowTTFT), TPT: sim.Duration(time.Millisecond)}
	fast := sim.LatencyConfig{TTFT: sim.Duration(80 * time.Millisecond), TPT: sim.Duration(200 * time.Microsecond)}
	_, simURL := serveSim(t, sim.Config{
		APIKeys: []string{"sk-console-test"},
		Models: map[string]sim.ModelConfig{
			consoleSlow: {RPM: 600, TPM: 600_000, Latency: &slow},
			consoleFast: {RPM: 900, TPM: 600_000, Latency: &fast},
		},
	})
	yaml := fmt.Sprintf(`
postgres_url: %q
broker: rabbitmq
amqp_url: %q
http_addr: 127.0.0.1:0
metrics_addr: 127.0.0.1:0
strategy: auto
api_keys:
  %s: acme
  %s: globex
admin_keys: [%s]
provider:
  base_url: %q
  api_key: sk-console-test
  timeout: 30s
models:
  %s: {rpm: 600, tpm: 600000}
  %s: {rpm: 600, tpm: 400000}
`, testsvc.PostgresURL(t), testVhost(t, testsvc.AMQPURL(t)), consoleAcmeKey, consoleGlobexKey, consoleAdminKey,
		simURL+"/v1", consoleSlow, consoleFast)
	cfg, err := config.Parse([]byte(yaml), func(string) (string, bool) { return "", false })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	s := &consoleStack{t: t, cfg: cfg, ctx: ctx}
	t.Cleanup(func() {
		cancel()
		s.wg.Wait()
	})
	ready := make(chan string, 1)
	s.run("producer", func(log *slog.Logger) error {
		return launch.Producer(ctx, cfg, launch.Options{Logger: log, Ready: func(addr string) { ready <- addr }})
	})
	select {
	case addr := <-ready:
		s.baseURL = "http://" + addr
	case <-time.After(60 * time.Second):
		t.Fatal("the producer did not start serving within 60s")
	}
	return s
}

// serveSim serves an llmsim of cfg (with its defaults) until the test
// ends and returns it with its URL.
func serveSim(t *testing.T, cfg sim.Config) (*sim.Simulator, string) {
	t.Helper()
	simulator, err := sim.New(cfg.WithDefaults())
	require.NoError(t, err)
	srv := httptest.NewServer(simulator)
	t.Cleanup(func() {
		simulator.Close()
		srv.Close()
	})
	return simulator, srv.URL
}

// run starts one process of the stack; the test's end stops it.
func (s *consoleStack) run(name string, f func(*slog.Logger) error) {
	log := slog.New(slog.NewTextHandler(testWriter{s.t, name}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s.wg.Go(func() {
		if err := f(log); err != nil && s.ctx.Err() == nil {
			s.t.Errorf("%s stopped: %v", name, err)
		}
	})
}

// startConsumers starts the two consumer replicas.
func (s *consoleStack) startConsumers() {
	for _, id := range []string{"replica-a", "replica-b"} {
		cfg := s.cfg
		cfg.Worker.ID = id
		s.run(id, func(log *slog.Logger) error { return launch.Consumer(s.ctx, cfg, launch.Options{Logger: log}) })
	}
}

// call makes one API request with key and decodes a JSON answer into out
// (when not nil); it returns the status.
func (s *consoleStack) call(method, path, key string, body, out any) int {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(s.t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(s.ctx, method, s.baseURL+path, rd)
	require.NoError(s.t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	if out != nil && resp.StatusCode < 300 {
		require.NoError(s.t, json.Unmarshal(data, out), "%s %s: %s", method, path, data)
	}
	return resp.StatusCode
}

// submit posts a job of model through the API and requires it accepted.
func (s *consoleStack) submit(key, id, model string, extra map[string]any) {
	s.t.Helper()
	j := map[string]any{"id": id, "model": model,
		"request": map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Hello from " + id}}, "max_tokens": 64}}
	for k, v := range extra {
		j[k] = v
	}
	code := s.call(http.MethodPost, "/v1/jobs", key, j, nil)
	require.Equal(s.t, http.StatusAccepted, code, "submit %s", id)
}

// submitLoad posts n jobs of model in batches.
func (s *consoleStack) submitLoad(key, model string, n int) {
	s.t.Helper()
	for start := 0; start < n; start += 100 {
		var jobs []map[string]any
		for i := start; i < min(n, start+100); i++ {
			jobs = append(jobs, map[string]any{"id": fmt.Sprintf("load-%04d", i), "model": model,
				"request": map[string]any{"messages": []any{map[string]any{"role": "user", "content": fmt.Sprintf("load %d", i)}}, "max_tokens": 48}})
		}
		code := s.call(http.MethodPost, "/v1/jobs:batch", key, jobs, nil)
		require.Less(s.t, code, 300, "batch submit")
	}
}

// testWriter sends a process's log lines to the test's log.
type testWriter struct {
	t    *testing.T
	name string
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("[%s] %s", w.name, bytes.TrimSpace(p))
	return len(p), nil
}
