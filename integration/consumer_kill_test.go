package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// TestConsumerKillAndRestart runs `consumer run` as a subprocess against
// real Postgres, RabbitMQ and an in-process llmsim, kills it with SIGKILL
// mid-run, starts another, and checks every job succeeded exactly once
// with the result its request gets from the simulator.
func TestConsumerKillAndRestart(t *testing.T) {
	const n = 600
	ctx := context.Background()
	bin := buildCmd(t, "consumer")
	pgURL := testsvc.PostgresURL(t)
	amqpURL := testVhost(t, testsvc.AMQPURL(t))

	s, err := sim.New(sim.Config{
		APIKeys: []string{"sk-kill-test"},
		Latency: sim.LatencyConfig{TTFT: sim.Duration(20 * time.Millisecond)},
		Models:  map[string]sim.ModelConfig{"qwen-plus": {}},
	})
	require.NoError(t, err)
	var calls atomic.Int64
	killAt := make(chan struct{})
	var killOnce sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/chat/completions") && calls.Add(1) >= n/4 {
			killOnce.Do(func() { close(killAt) })
		}
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { s.Close(); srv.Close() })

	cfgPath := filepath.Join(t.TempDir(), "consumer.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(`
broker: rabbitmq
metrics_addr: 127.0.0.1:0
provider:
  timeout: 10s
worker:
  lease: 3s
  retry_base: 50ms
  retry_max: 500ms
  shutdown_grace: 5s
  prefetch: 100
`), 0o600))
	env := append(os.Environ(),
		"LLMQ_CONFIG="+cfgPath,
		"LLMQ_POSTGRES_URL="+pgURL,
		"LLMQ_AMQP_URL="+amqpURL,
		"LLMQ_PROVIDER_BASE_URL="+srv.URL+"/v1",
		"LLMQ_PROVIDER_API_KEY=sk-kill-test",
	)

	// Publish first, so the killed consumer has plenty of work in flight.
	pub, err := rabbitmq.NewPublisher(ctx, rabbitmq.Config{URL: amqpURL})
	require.NoError(t, err)
	bodies := map[string][]byte{}
	for i := range n {
		id := fmt.Sprintf("kill-%04d", i)
		body := []byte(fmt.Sprintf(`{"id":%q,"model":"qwen-plus","priority":%q,"request":{"messages":[{"role":"user","content":"ticket %d"}],"max_tokens":64}}`,
			id, job.Priorities[i%3], i))
		bodies[id] = body
		require.NoError(t, pub.PublishIntake(ctx, job.Priorities[i%3], broker.Message{Key: id, Body: body}))
	}
	require.NoError(t, pub.Close())

	first := startProc(t, bin, append(env, "LLMQ_WORKER_ID=kill-first"), "run")
	select {
	case <-killAt:
	case <-first.done:
		t.Fatalf("first consumer exited early: %v\n%s", first.err, first.out.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("first consumer made no progress:\n%s", first.out.String())
	}
	require.NoError(t, first.cmd.Process.Kill()) // SIGKILL mid-run
	<-first.done

	pool, err := pgxpool.New(ctx, pgURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var before int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = 'succeeded'`).Scan(&before))
	t.Logf("killed the first consumer after %d provider calls, %d jobs succeeded", calls.Load(), before)
	require.Less(t, before, n, "the kill must come mid-run")

	second := startProc(t, bin, append(env, "LLMQ_WORKER_ID=kill-second"), "run")
	deadline := time.After(3 * time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for done := before; done < n; {
		select {
		case <-tick.C:
		case <-second.done:
			t.Fatalf("second consumer exited: %v\n%s", second.err, second.out.String())
		case <-deadline:
			t.Fatalf("only %d of %d jobs succeeded after the restart\n%s", done, n, second.out.tail(30))
		}
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = 'succeeded'`).Scan(&done))
	}
	require.NoError(t, second.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-second.done:
	case <-time.After(30 * time.Second):
		t.Fatal("second consumer did not stop on SIGTERM")
	}
	require.NoError(t, second.err, second.out.tail(20))
	require.Contains(t, second.out.String(), `"msg":"worker stopped"`)

	rows, err := pool.Query(ctx, `SELECT id, status, response, attempts FROM jobs ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var id, status string
		var resp []byte
		var attempts int
		require.NoError(t, rows.Scan(&id, &status, &resp, &attempts))
		require.Equal(t, "succeeded", status, id)
		var out struct {
			Choices []struct{ Message struct{ Content string } }
		}
		require.NoError(t, json.Unmarshal(resp, &out))
		var j job.Job
		require.NoError(t, json.Unmarshal(bodies[id], &j))
		req, err := provider.SetTopLevel(j.Request, "model", []byte(`"qwen-plus"`))
		require.NoError(t, err)
		require.Equal(t, sim.ExpectedContent(req), out.Choices[0].Message.Content, id)
		seen++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, n, seen, "one row per job")
	t.Logf("%d jobs succeeded exactly once; %d provider calls in all (at-least-once calls, exactly-once results)", n, calls.Load())
	require.NotContains(t, first.out.String()+second.out.String(), "sk-kill-test", "the API key never reaches the logs")
}
