package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
)

// BenchmarkShutdownHandBack times a worker's stop while 2,000 claimed jobs
// wait in its dispatcher: every one is handed back (its claim released in
// Postgres, its message to the broker) before the stop returns. lanes:
// lane deliveries of the memory broker waiting for a quota that admits one
// call a minute; direct: jobs taken directly off a RabbitMQ intake waiting
// behind one blocked call, each handed back as a wake-up published on its
// lane. Run with -benchtime 1x.
func BenchmarkShutdownHandBack(b *testing.B) {
	b.Run("lanes", benchHandBackLanes)
	b.Run("direct", benchHandBackDirect)
}

const handBackJobs = 2000

func benchHandBackDirect(b *testing.B) {
	const n = handBackJobs
	for range b.N {
		b.StopTimer()
		h, release, _ := floodIntake(b, 1, n, "hb", func(cfg *Config) {
			cfg.TenantHold = 10 * n // a hold beyond the flood: every job is taken directly and waits
			cfg.MaxInFlight = 2 * n
			cfg.ShutdownGrace = time.Millisecond
		})
		ctx := context.Background()
		require.Eventually(b, func() bool {
			var running int
			require.NoError(b, h.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = 'running'`).Scan(&running))
			return running == n
		}, time.Minute, 10*time.Millisecond, "every job taken directly")
		b.StartTimer()
		start := time.Now()
		h.stop()
		took := time.Since(start)
		b.StopTimer()
		close(release)
		var queued int
		require.NoError(b, h.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = $1`, job.StatusQueued).Scan(&queued))
		require.Equal(b, n, queued, "every job handed back")
		b.ReportMetric(float64(took.Milliseconds()), "stop_ms")
		b.ReportMetric(float64(n)/took.Seconds(), "handed_back/s")
	}
}

func benchHandBackLanes(b *testing.B) {
	const n = handBackJobs
	models := map[string]config.Model{"slow": {Strategy: "ratelimit", RPM: 1}}
	for range b.N {
		b.StopTimer()
		h := newHarness(b, sim.Config{Models: map[string]sim.ModelConfig{"slow": {}}}, models)
		mem := memory.New(memory.Config{})
		bodies := make([][]byte, n)
		for i := range bodies {
			id := fmt.Sprintf("hb-%d", i)
			bodies[i] = jobBody(id, "slow", i, nil)
		}
		h.submitMany(mem.Publisher(), bodies)
		cfg := h.cfg
		cfg.TenantHold = -1 // no parking: every job waits in the dispatcher
		cfg.Prefetch = n
		cfg.MaxInFlight = 2 * n
		sub := mem.Subscriber()
		_, stop := h.start(sub, cfg)
		ctx := context.Background()
		require.Eventually(b, func() bool {
			var running int
			require.NoError(b, h.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = 'running'`).Scan(&running))
			return running == n-1 // the first call was admitted and succeeded
		}, time.Minute, 10*time.Millisecond, "every job claimed")
		b.StartTimer()
		start := time.Now()
		stop()
		took := time.Since(start)
		b.StopTimer()
		var queued int
		require.NoError(b, h.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = $1`, job.StatusQueued).Scan(&queued))
		require.Equal(b, n-1, queued, "every waiting job handed back")
		b.ReportMetric(float64(took.Milliseconds()), "stop_ms")
		b.ReportMetric(float64(n-1)/took.Seconds(), "handed_back/s")
		require.NoError(b, sub.Close())
		mem.Close()
	}
}
