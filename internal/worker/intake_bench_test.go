package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/cpustat"
	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
)

// BenchmarkPipelineFromIntake is BenchmarkPipeline with the jobs entering
// as a backend publishes them: b.N raw messages on the intake, the
// ingester storing them while the worker runs them, the clock from the
// ingester's start to the last success (jobs/s end to end). The worker
// runs with its default prefetch, as deployed. "lanes" forwards every job
// through a lane (worker.lanes_only); "direct" is the default, where the
// worker runs the jobs it has room for without a lane (direct.go).
func BenchmarkPipelineFromIntake(b *testing.B) {
	for _, direct := range []bool{false, true} {
		name := "lanes"
		if direct {
			name = "direct"
		}
		b.Run(name, func(b *testing.B) { benchFromIntake(b, direct) })
	}
}

func benchFromIntake(b *testing.B, direct bool) {
	cfgR, pub, sub := rabbitClients(b)
	h := newHarness(b, sim.Config{Models: map[string]sim.ModelConfig{"bench": {}}}, benchModels)
	h.lanes = pub
	ctx := context.Background()
	n := b.N
	for i := range n {
		id := fmt.Sprintf("bench-%d", i)
		require.NoError(b, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: jobBody(id, "bench", i, nil)}))
	}
	intake := intakeSubscriber(b, cfgR)
	cfg := h.cfg
	cfg.Prefetch, cfg.MaxInFlight = 0, 0 // defaults
	cfg.LanesOnly = !direct
	b.ResetTimer()
	cpu := cpustat.Start(h.pool, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	start := time.Now()
	finish := benchRelay(b, h.store, pub)
	w, stop := h.start(sub, cfg)
	ing, err := ingest.New(ingest.Config{}, ingest.Deps{Store: h.store, Intake: intake, Lanes: pub, Runner: w})
	require.NoError(b, err)
	ictx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ing.Run(ictx) }()
	got := h.wait(n, 5*time.Minute)
	elapsed := time.Since(start)
	finish()
	b.StopTimer()
	cpu.Report(b, n, "consumer")
	stop()
	cancel()
	require.NoError(b, <-done)
	require.Equal(b, n, got["succeeded"])
	b.ReportMetric(float64(n)/elapsed.Seconds(), "jobs/s")
}

func intakeSubscriber(tb testing.TB, cfg rabbitmq.Config) *rabbitmq.Subscriber {
	tb.Helper()
	s, err := rabbitmq.NewIntakeSubscriber(context.Background(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = s.Close() })
	return s
}
