package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/llmq/llmq/internal/sim"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs llmsim with args on a free loopback port and returns its base URL.
func start(t *testing.T, args ...string) (string, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	logs := &syncBuffer{}
	go func() {
		done <- run(ctx, append([]string{"--addr", "127.0.0.1:0"}, args...), logs, func(a net.Addr) { addrs <- a })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("llmsim did not shut down")
		}
	})
	select {
	case a := <-addrs:
		return "http://" + a.String(), logs
	case err := <-done:
		t.Fatalf("llmsim exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("llmsim did not start listening")
	}
	return "", nil
}

func chat(t *testing.T, client *http.Client, url, key, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/compatible-mode/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

func TestRunFromYAML(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sim.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
dialect: dashscope
api_keys: [sk-test-key]
headers: {retry_after: true}
models:
  qwen-plus:
    rpm: 2
    max_concurrency: 4
    fallback: [qwen-flash]
`), 0o600))
	url, logs := start(t, "--config", path)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	body := `{"model":"qwen-plus","messages":[{"role":"user","content":"hello"}]}`

	resp, _ := chat(t, client, url, "", body)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	for range 2 {
		resp, b := chat(t, client, url, "sk-test-key", body)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		var c struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal(b, &c))
		require.Equal(t, sim.ExpectedContent([]byte(body)), c.Choices[0].Message.Content)
	}
	resp, b := chat(t, client, url, "sk-test-key", body)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Contains(t, string(b), "Throttling.RateQuota")
	require.NotEmpty(t, resp.Header.Get("Retry-After"))

	mresp, err := client.Get(url + "/metrics")
	require.NoError(t, err)
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	require.Contains(t, string(mb), `llmsim_rate_limited_total{model="qwen-plus",reason="rpm"} 1`)
	require.NotContains(t, logs.String(), "sk-test-key")
}

func TestRunDefaults(t *testing.T) {
	url, _ := start(t)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, b := chat(t, client, url, "", `{"model":"qwen-flash","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	require.Equal(t, "1200", resp.Header.Get("x-ratelimit-limit-requests"))
}

func TestRunBadConfigNamesKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sim.yaml")
	require.NoError(t, os.WriteFile(path, []byte("models:\n  m:\n    rpm: 5\n    tpmm: 9\n"), 0o600))
	err := run(t.Context(), []string{"--addr", "127.0.0.1:0", "--config", path}, io.Discard, nil)
	require.ErrorContains(t, err, "tpmm")
	err = run(t.Context(), []string{"--bogus"}, io.Discard, nil)
	require.Error(t, err)
}

func TestExampleConfigParses(t *testing.T) {
	cfg, err := sim.LoadConfig("sim.example.yaml")
	require.NoError(t, err)
	require.Equal(t, int64(90000), cfg.Models["qwen-plus"].TPM)
}
