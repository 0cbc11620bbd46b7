package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/launch"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// The limits of the cross-provider scenario. Provider a admits far less
// than llmq was told (an account shared with someone else, or a limit
// lowered without notice), so it answers 429s; provider b is configured
// as it is.
const (
	xpJobs     = 100
	xpRPMOfA   = 20  // what provider a admits
	xpRPMInCfg = 600 // what llmq believes of a
	xpRPMOfB   = 60  // b's limit, known to llmq: it binds
)

// TestCrossProviderFallback: one upstream model (qwen-plus) on two
// providers, two llmsim instances with keys of their own, behind two
// entries of models: whose fallback chain crosses from a to b. A consumer
// over real RabbitMQ and Postgres runs every job to success; the jobs a
// refuses finish on b after worker.fallback_after_429 429s (fallback is
// decided on 429s alone), neither provider ever admits more than its
// sliding-minute limit, and llmq keeps within b's quota (no 429 from b).
//
// a's model runs the ratelimit strategy, which sends at the configured
// rate whatever the 429s: auto would learn a's real rate and then hold the
// jobs in a's queue at that rate, drawing few 429s, so few jobs would ever
// leave a (fallback waits for 429s; docs/design.md#fallback).
func TestCrossProviderFallback(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a consumer against two simulated providers: not in -short")
	}
	pgURL := testsvc.PostgresURL(t)
	amqpURL := testVhost(t, testsvc.AMQPURL(t))

	const keyA, keyB = "sk-provider-a-SECRET-7f3e", "sk-provider-b-SECRET-91ac"
	simA := startSim(t, sim.Config{APIKeys: []string{keyA}, Dialect: sim.DialectDashScope,
		Models: map[string]sim.ModelConfig{"qwen-plus": {RPM: xpRPMOfA}}})
	simB := startSim(t, sim.Config{APIKeys: []string{keyB},
		Models: map[string]sim.ModelConfig{"qwen-plus": {RPM: xpRPMOfB}}})

	yaml := fmt.Sprintf(`
broker: rabbitmq
http_addr: 127.0.0.1:0
metrics_addr: 127.0.0.1:0
providers:
  a: {base_url: "%s/v1", dialect: dashscope, timeout: 10s}
  b: {base_url: "%s/v1", timeout: 10s}
worker: {lease: 5s, retry_base: 50ms, retry_max: 500ms, shutdown_grace: 5s, fallback_after_429: 2}
models:
  qwen-plus: {provider: a, rpm: %d, strategy: ratelimit, fallback: [qwen-plus-b]}
  qwen-plus-b: {provider: b, upstream: qwen-plus, rpm: %d}
`, simA.url, simB.url, xpRPMInCfg, xpRPMOfB)
	// The keys come from the environment, as from a Kubernetes secret.
	env := map[string]string{
		"LLMQ_POSTGRES_URL":        pgURL,
		"LLMQ_AMQP_URL":            amqpURL,
		"LLMQ_PROVIDERS_A_API_KEY": keyA,
		"LLMQ_PROVIDERS_B_API_KEY": keyB,
	}
	cfg, err := config.Parse([]byte(yaml), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	require.NoError(t, err)
	cfg.Worker.ID = "xp-consumer"

	var logs lockedBuffer
	stop := runConsumer(t, cfg, slog.New(slog.NewJSONHandler(&logs, nil)))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pub, err := rabbitmq.NewPublisher(ctx, rabbitmq.Config{URL: amqpURL})
	require.NoError(t, err)
	defer pub.Close()
	for i := range xpJobs {
		id := fmt.Sprintf("xp-%03d", i)
		body := fmt.Sprintf(`{"id":%q,"model":"qwen-plus","request":{"messages":[{"role":"user","content":"[job:%s] summarise"}],"max_tokens":16}}`, id, id)
		require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: []byte(body)}))
	}

	pool, err := pgxpool.New(ctx, pgURL)
	require.NoError(t, err)
	defer pool.Close()
	count := func(cond string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE `+cond).Scan(&n))
		return n
	}
	deadline := time.Now().Add(240 * time.Second)
	for count(`status IN ('succeeded','failed','dead','cancelled')`) < xpJobs {
		if time.Now().After(deadline) {
			var statuses string
			require.NoError(t, pool.QueryRow(ctx, `SELECT string_agg(status || ':' || n, ' ') FROM (SELECT status, count(*) n FROM jobs GROUP BY status) s`).Scan(&statuses))
			t.Fatalf("not every job ended within 240s: %s; a %+v; b %+v; log tail:\n%s", statuses,
				simA.sim.Stats().Models["qwen-plus"].RateLimited, simB.sim.Stats().Models["qwen-plus"].RateLimited, logs.tail(20))
		}
		waitABit(ctx)
	}
	stop()

	onA, onB := count(`model_used = 'qwen-plus'`), count(`model_used = 'qwen-plus-b'`)
	stA, stB := simA.sim.Stats().Models["qwen-plus"], simB.sim.Stats().Models["qwen-plus"]
	_, minuteA := sim.SlidingMinute(stA.Series)
	_, minuteB := sim.SlidingMinute(stB.Series)
	t.Logf("jobs: %d succeeded, %d on provider a, %d on provider b", count(`status = 'succeeded'`), onA, onB)
	t.Logf("provider a: %d requests, %d admitted, %d 429s, most in a sliding minute %d (limit %d), overruns %v",
		stA.Requests, stA.Admitted, stA.RateLimitedTotal, minuteA, xpRPMOfA, stA.Overruns)
	t.Logf("provider b: %d requests, %d admitted, %d 429s, most in a sliding minute %d (limit %d), overruns %v",
		stB.Requests, stB.Admitted, stB.RateLimitedTotal, minuteB, xpRPMOfB, stB.Overruns)

	require.Equal(t, xpJobs, count(`status = 'succeeded'`))
	require.Equal(t, xpJobs, onA+onB)
	require.Positive(t, stA.RateLimitedTotal, "provider a must have rate-limited")
	require.Positive(t, onB, "jobs refused by a must finish on b")
	require.LessOrEqual(t, minuteA, int64(xpRPMOfA))
	require.LessOrEqual(t, minuteB, int64(xpRPMOfB))
	for _, st := range []sim.ModelStats{stA, stB} {
		for reason, n := range st.Overruns {
			require.Zero(t, n, "overruns of %s", reason)
		}
	}
	require.Zero(t, stB.RateLimitedTotal, "llmq must keep within b's quota")
	// Every job on b got there by 429s on a: fallback_after_429 of them.
	require.Zero(t, count(`model_used = 'qwen-plus-b' AND jsonb_array_length(errors) < 2`), "a job left a before two 429s")
	require.Equal(t, stA.Admitted, int64(onA), "provider a's admitted calls are its successful jobs")
	// Both keys reached their provider (each llmsim accepts only its own)
	// and neither is in the log or in Postgres.
	for _, key := range []string{keyA, keyB} {
		require.NotContains(t, logs.String(), key)
		require.Zero(t, count(fmt.Sprintf(`jobs::text LIKE '%%%s%%'`, key)))
	}
}

// waitABit is the pause between two polls of Postgres.
func waitABit(ctx context.Context) {
	t := time.NewTimer(200 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// simServer is one llmsim over HTTP.
type simServer struct {
	sim *sim.Simulator
	url string
}

func startSim(t *testing.T, cfg sim.Config) simServer {
	t.Helper()
	s, err := sim.New(cfg.WithDefaults())
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	t.Cleanup(func() { s.Close(); srv.CloseClientConnections(); srv.Close() })
	return simServer{sim: s, url: srv.URL}
}

// runConsumer runs launch.Consumer in the test process until the returned
// stop (also called at cleanup) ends it, and waits until it serves.
func runConsumer(t *testing.T, cfg config.Config, log *slog.Logger) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- launch.Consumer(ctx, cfg, launch.Options{Logger: log, Ready: func(string) { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("consumer stopped before serving: %v", err)
	case <-time.After(time.Minute):
		cancel()
		t.Fatal("consumer not serving within a minute")
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("consumer: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
