package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// Limits of the load tests: RPM 30,000 and TPM 3.6M. The simulator's mix
// (70% 30-token answers, 30% long ones capped by max_tokens; prompts of ~20
// or ~170 tokens) averages ~140 tokens a job, so TPM is the binding limit
// (~25,000 jobs/min against 30,000 requests/min).
const (
	loadJobs = 2000
	loadRPM  = 30000
	loadTPM  = 3_600_000
)

func loadHarness(t *testing.T) *harness {
	models := map[string]config.Model{"qwen-plus": {RPM: loadRPM, TPM: loadTPM, Warmup: 3 * time.Second}}
	return newHarness(t, sim.Config{
		Models: map[string]sim.ModelConfig{"qwen-plus": {RPM: loadRPM, TPM: loadTPM}},
		Output: sim.OutputMix{Short: 30, Long: 600, LongShare: 0.3},
	}, models)
}

func runLoad(t *testing.T, h *harness, pub broker.Publisher, sub broker.Subscriber) {
	ctx := context.Background()
	bodies := make(map[string][]byte, loadJobs)
	for i := range loadJobs {
		id := fmt.Sprintf("load-%d", i)
		bodies[id] = jobBody(id, "qwen-plus", i, nil)
	}
	start := time.Now()
	w, _ := h.start(sub, h.cfg)
	for i := range loadJobs {
		id := fmt.Sprintf("load-%d", i)
		h.submit(pub, laneOf(i), id, bodies[id])
	}
	got := h.wait(loadJobs, 3*time.Minute)
	elapsed := time.Since(start)
	require.Equal(t, map[string]int{"succeeded": loadJobs}, got)
	h.checkResults(ctx, bodies)

	var n int
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = 'succeeded'`).Scan(&n))
	require.Equal(t, loadJobs, n, "one result row per job")

	st := h.sim.Stats().Models["qwen-plus"]
	share := float64(st.RateLimitedTotal) / float64(max(st.Requests, 1))
	t.Logf("%d jobs in %s (%.0f jobs/s); provider requests %d, 429s %d (%.2f%% of calls), tokens %d, overruns %v",
		loadJobs, elapsed.Round(time.Millisecond), float64(loadJobs)/elapsed.Seconds(), st.Requests, st.RateLimitedTotal, 100*share, st.Tokens, st.Overruns)
	snap := w.dispatcherFor("qwen-plus").gov.Snapshot()
	t.Logf("governor: concurrency limit %d, pacer interval %s, levels %v, calibration %+v, controller %+v",
		snap.ConcurrencyLimit, snap.PacerInterval, snap.Levels, snap.Calibration, snap.Controller)
	for reason, n := range st.Overruns {
		require.Zero(t, n, "simulator saw admitted traffic over %s", reason)
	}
}

func TestRabbitMQLoad(t *testing.T) {
	t.Parallel()
	h := loadHarness(t)
	_, pub, sub := rabbitClients(t)
	runLoad(t, h, pub, sub)
}

func TestKafkaLoad(t *testing.T) {
	t.Parallel()
	h := loadHarness(t)
	ctx := context.Background()
	cfg := kafka.Config{Brokers: testsvc.KafkaBrokers(t), Prefix: testsvc.KafkaPrefix(t)}
	pub, err := kafka.NewPublisher(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	sub, err := kafka.NewSubscriber(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { sub.Close() })
	runLoad(t, h, pub, sub)
}

// rabbitClients connects a publisher and a subscriber under a name prefix of
// the test's own and deletes that topology, queues included, at the end, so
// runs leave no quorum queues behind on the shared broker.
func rabbitClients(tb testing.TB) (rabbitmq.Config, *rabbitmq.Publisher, *rabbitmq.Subscriber) {
	tb.Helper()
	ctx := context.Background()
	cfg := rabbitmq.Config{URL: testsvc.AMQPURL(tb), Prefix: testsvc.AMQPPrefix(tb)}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rabbitmq.DeleteTopology(ctx, cfg); err != nil {
			tb.Errorf("delete topology: %v", err)
		}
	})
	pub, err := rabbitmq.NewPublisher(ctx, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { pub.Close() })
	sub, err := rabbitmq.NewSubscriber(ctx, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { sub.Close() })
	return cfg, pub, sub
}
