package worker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
)

// BenchmarkShutdownHandBack times a worker's stop while 2,000 claimed jobs
// wait in its dispatcher: every one is handed back (its claim released in
// Postgres, its message to the broker) before the stop returns. lanes:
// lane deliveries of the memory broker waiting for a quota that admits one
// call a minute; direct: jobs taken directly off a RabbitMQ intake waiting
// behind one blocked call, each handed back as a wake-up published on its
// lane. Run with -benchtime 1x: each round sets up its own harness.
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
		awaitStatus(b, h, job.StatusRunning, n, "every job taken directly")
		timeStop(b, h, n)
		close(release)
	}
}

func benchHandBackLanes(b *testing.B) {
	const n = handBackJobs
	for range b.N {
		b.StopTimer()
		h, _, sub, _ := waitingForQuota(b, n, "hb")
		timeStop(b, h, n-1) // the first job ran
		require.NoError(b, sub.Close())
	}
}

// timeStop times h.stop, checks that the waiting jobs were handed back
// (queued again) and reports the time.
func timeStop(b *testing.B, h *harness, waiting int) {
	b.StartTimer()
	start := time.Now()
	h.stop()
	took := time.Since(start)
	b.StopTimer()
	require.Equal(b, waiting, countStatus(b, h, job.StatusQueued), "every waiting job handed back")
	b.ReportMetric(float64(took.Milliseconds()), "stop_ms")
	b.ReportMetric(float64(waiting)/took.Seconds(), "handed_back/s")
}
