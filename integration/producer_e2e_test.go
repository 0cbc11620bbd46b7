package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// TestProducerEndToEnd runs `producer serve` and `consumer run` as
// subprocesses on real Postgres and RabbitMQ (a vhost of its own) with an
// in-process llmsim: jobs submitted over HTTP (single and batch) are
// polled until they succeed with the simulator's answer, a re-submission
// returns the finished job, another tenant sees 404, /v1/status measures a
// drain rate, and both processes stop cleanly on SIGTERM.
func TestProducerEndToEnd(t *testing.T) {
	const n = 60
	start := time.Now()
	producerBin := buildCmd(t, "producer")
	consumerBin := buildCmd(t, "consumer")
	pgURL := testsvc.PostgresURL(t)
	amqpURL := testVhost(t, testsvc.AMQPURL(t))

	s, err := sim.New(sim.Config{
		APIKeys: []string{"sk-producer-e2e"},
		Latency: sim.LatencyConfig{TTFT: sim.Duration(5 * time.Millisecond)},
		Models:  map[string]sim.ModelConfig{"qwen-plus": {}},
	})
	require.NoError(t, err)
	llm := httptest.NewServer(s)
	t.Cleanup(func() { s.Close(); llm.Close() })

	cfgPath := filepath.Join(t.TempDir(), "llmq.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(`
broker: rabbitmq
http_addr: 127.0.0.1:0
metrics_addr: 127.0.0.1:0
provider:
  timeout: 10s
worker:
  lease: 5s
  retry_base: 50ms
  retry_max: 500ms
  shutdown_grace: 5s
backpressure:
  soft_limit: 1000
  hard_limit: 5000
  status_interval: 1s
`), 0o600))
	env := append(os.Environ(),
		"LLMQ_CONFIG="+cfgPath,
		"LLMQ_POSTGRES_URL="+pgURL,
		"LLMQ_AMQP_URL="+amqpURL,
		"LLMQ_API_KEYS=key-acme-e2e-0123456789:acme,key-globex-e2e-0123456789:globex",
		"LLMQ_PROVIDER_BASE_URL="+llm.URL+"/v1",
		"LLMQ_PROVIDER_API_KEY=sk-producer-e2e",
	)
	t.Logf("built producer and consumer in %s", time.Since(start).Round(time.Millisecond))
	producer := startProc(t, producerBin, env, "serve")
	base := "http://" + producer.waitFor(t, regexp.MustCompile(`"msg":"serving producer API","addr":"([^"]+)"`))
	consumer := startProc(t, consumerBin, append(env, "LLMQ_WORKER_ID=e2e-1"), "run")

	call := func(method, path, key string, body []byte) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, data
	}
	jobJSON := func(i int) string {
		return fmt.Sprintf(`{"id":"e2e-%03d","model":"qwen-plus","request":{"messages":[{"role":"user","content":"ticket %d"}],"max_tokens":32}}`, i, i)
	}
	// Half one by one, half in one batch.
	for i := range n / 2 {
		code, body := call("POST", "/v1/jobs", "key-acme-e2e-0123456789", []byte(jobJSON(i)))
		require.Equal(t, http.StatusAccepted, code, "%s", body)
	}
	var items []string
	for i := n / 2; i < n; i++ {
		items = append(items, jobJSON(i))
	}
	code, body := call("POST", "/v1/jobs:batch", "key-acme-e2e-0123456789", []byte("["+strings.Join(items, ",")+"]"))
	require.Equal(t, http.StatusAccepted, code, "%s", body)
	var batch struct{ Created int }
	require.NoError(t, json.Unmarshal(body, &batch))
	require.Equal(t, n/2, batch.Created)

	submitted := time.Now()
	// Poll until every job has succeeded.
	deadline := time.Now().Add(2 * time.Minute)
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for i := range n {
		id := fmt.Sprintf("e2e-%03d", i)
		for {
			code, body := call("GET", "/v1/jobs/"+id, "key-acme-e2e-0123456789", nil)
			require.Equal(t, http.StatusOK, code, "%s", body)
			var v struct {
				Status    string
				ModelUsed *string `json:"model_used"`
				Usage     *struct {
					TotalTokens int `json:"total_tokens"`
				}
				Response json.RawMessage
			}
			require.NoError(t, json.Unmarshal(body, &v))
			if v.Status == "succeeded" {
				require.NotNil(t, v.ModelUsed)
				require.Equal(t, "qwen-plus", *v.ModelUsed)
				require.NotNil(t, v.Usage)
				require.Positive(t, v.Usage.TotalTokens)
				require.NotEmpty(t, v.Response)
				break
			}
			require.Contains(t, []string{"queued", "running", "retrying"}, v.Status, id)
			if time.Now().After(deadline) {
				t.Fatalf("job %s still %s\nproducer:\n%s\nconsumer:\n%s", id, v.Status, producer.out.tail(20), consumer.out.tail(20))
			}
			select {
			case <-consumer.done:
				t.Fatalf("consumer exited: %v\n%s", consumer.err, consumer.out.tail(30))
			case <-poll.C:
			}
		}
	}

	t.Logf("%d jobs succeeded %s after their submission", n, time.Since(submitted).Round(time.Millisecond))
	// A re-submission returns the finished job; another tenant sees 404.
	code, body = call("POST", "/v1/jobs", "key-acme-e2e-0123456789", []byte(jobJSON(0)))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(body), `"status":"succeeded"`)
	code, _ = call("GET", "/v1/jobs/e2e-000", "key-globex-e2e-0123456789", nil)
	require.Equal(t, http.StatusNotFound, code)

	// The status refreshes every second: wait for the drained backlog.
	for {
		code, body := call("GET", "/v1/status", "key-acme-e2e-0123456789", nil)
		require.Equal(t, http.StatusOK, code)
		var st struct {
			State     string
			Total     int64
			DrainRate float64 `json:"drain_rate"`
		}
		require.NoError(t, json.Unmarshal(body, &st))
		if st.Total == 0 && st.DrainRate > 0 {
			require.Equal(t, "ok", st.State)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed the drain: %s", body)
		}
		select {
		case <-producer.done:
			t.Fatalf("producer exited: %v\n%s", producer.err, producer.out.tail(30))
		case <-poll.C:
		}
	}

	for _, p := range []*proc{consumer, producer} {
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not stop on SIGTERM", p.name)
		}
		require.NoError(t, p.err, p.out.tail(20))
	}
	for _, secret := range []string{"key-acme-e2e-0123456789", "key-globex-e2e-0123456789", "sk-producer-e2e"} {
		require.NotContains(t, producer.out.String()+consumer.out.String(), secret, "keys never reach the logs")
	}
}
