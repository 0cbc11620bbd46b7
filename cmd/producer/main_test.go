package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// envOf turns a map into run's env function; unset keys are absent (the
// process environment is not consulted).
func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// kafkaEnv points the command at a fresh in-process Kafka of the test's own.
func kafkaEnv(t *testing.T) map[string]string {
	return map[string]string{
		"LLMQ_BROKER":        "kafka",
		"LLMQ_KAFKA_BROKERS": strings.Join(testsvc.KafkaBrokers(t), ","),
	}
}

func totalDepth(t *testing.T, brokers []string) int64 {
	t.Helper()
	insp, err := kafka.NewInspector(context.Background(), kafka.Config{Brokers: brokers})
	require.NoError(t, err)
	defer insp.Close()
	var total int64
	for _, lane := range job.Priorities {
		n, err := insp.Depth(context.Background(), lane)
		require.NoError(t, err)
		total += n
	}
	return total
}

func line(id string, extra string) string {
	return fmt.Sprintf(`{"id":%q,"model":"qwen-plus","request":{"messages":[{"role":"user","content":"hi"}]}%s}`, id, extra)
}

func TestSubmitFile(t *testing.T) {
	t.Parallel()
	env := kafkaEnv(t)
	lines := []string{
		line("a1", ""),
		line("a2", `,"priority":"high"`),
		"",
		line("a3", `,"tenant":"support"`),
		`{"id":"bad-1","request":{"messages":[{"role":"user","content":"hi"}]}}`, // no model
		`not json`,
		line("a4", `,"priority":"low"`),
	}
	path := filepath.Join(t.TempDir(), "jobs.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"submit", "-f", path}, envOf(env), nil, &stdout, &stderr)
	require.Error(t, err, "a rejected line makes the run fail")
	out := stdout.String()
	assert.Contains(t, out, "6 lines")
	assert.Contains(t, out, "4 accepted, 2 rejected, 0 failed")
	assert.Contains(t, out, "line 5 (id bad-1): invalid job: model: is required")
	assert.Regexp(t, regexp.MustCompile(`line 6: invalid job: malformed JSON`), out)
	assert.EqualValues(t, 4, totalDepth(t, strings.Split(env["LLMQ_KAFKA_BROKERS"], ",")))

	// Only good lines, from stdin: success.
	stdout.Reset()
	in := strings.NewReader(line("b1", "") + "\n" + line("b2", "") + "\n")
	require.NoError(t, run(context.Background(), []string{"submit", "-f", "-"}, envOf(env), in, &stdout, &stderr))
	assert.Contains(t, stdout.String(), "2 accepted, 0 rejected, 0 failed")
}

func TestSubmitRejectsOverlongLine(t *testing.T) {
	t.Parallel()
	env := kafkaEnv(t)
	env["LLMQ_LIMITS_MAX_PAYLOAD_BYTES"] = "512"
	long := line("long", `,"metadata":{"pad":"`+strings.Repeat("x", 5000)+`"}`)
	in := strings.NewReader(long + "\n" + line("ok", "") + "\n")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"submit", "-f", "-"}, envOf(env), in, &stdout, &stderr)
	require.Error(t, err)
	assert.Contains(t, stdout.String(), "1 accepted, 1 rejected")
	assert.Contains(t, stdout.String(), "line 1: invalid job: line is over the 512 byte limit")
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	require.Error(t, run(context.Background(), nil, envOf(nil), nil, &stdout, &stderr))
	require.Error(t, run(context.Background(), []string{"nope"}, envOf(nil), nil, &stdout, &stderr))
	require.Error(t, run(context.Background(), []string{"submit"}, envOf(nil), nil, &stdout, &stderr))
	err := run(context.Background(), []string{"serve"}, envOf(map[string]string{
		"LLMQ_POSTGRES_URL": "postgres://127.0.0.1:1/x", "LLMQ_HTTP_ADDR": "0.0.0.0:8080",
	}), nil, &stdout, &stderr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "refusing to serve unauthenticated")
}

// lockedBuffer is a concurrency-safe writer that signals when a line
// matching a pattern arrives.
type lockedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	re    *regexp.Regexp
	match chan string
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if m := b.re.FindSubmatch(p); m != nil {
		select {
		case b.match <- string(m[1]):
		default:
		}
	}
	return b.buf.Write(p)
}

func TestServe(t *testing.T) {
	t.Parallel()
	env := kafkaEnv(t)
	env["LLMQ_POSTGRES_URL"] = testsvc.PostgresURL(t)
	env["LLMQ_HTTP_ADDR"] = "127.0.0.1:0"
	env["LLMQ_API_KEYS"] = "k-acme-123-0123456789:acme"
	logs := &lockedBuffer{re: regexp.MustCompile(`"msg":"serving producer API","addr":"([^"]+)"`), match: make(chan string, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, envOf(env), nil, io.Discard, logs) }()
	var addr string
	select {
	case addr = <-logs.match:
	case err := <-done:
		t.Fatalf("serve ended: %v\n%s", err, logs.buf.String())
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not start")
	}
	base := "http://" + addr
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/jobs", strings.NewReader(line("s1", "")))
	req.Header.Set("Authorization", "Bearer k-acme-123-0123456789")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "%s", body)

	req, _ = http.NewRequest(http.MethodGet, base+"/v1/jobs/s1", nil)
	req.Header.Set("Authorization", "Bearer k-acme-123-0123456789")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	var v struct{ Status string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	resp.Body.Close()
	assert.Equal(t, "queued", v.Status)

	resp, err = http.Get(base + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	http.DefaultClient.CloseIdleConnections()

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not stop")
	}
	assert.NotContains(t, logs.buf.String(), "k-acme-123-0123456789", "API keys never reach the logs")
}
