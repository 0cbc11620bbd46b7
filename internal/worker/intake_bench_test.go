package worker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
// worker runs the jobs it has room for without a lane (direct.go), and
// writes the row of one whose call is quick once, finished (writeonce.go);
// "direct_two_writes" stores every direct job claimed before its call
// (worker.store_delay negative). With the whole backlog waiting at the
// start nearly every job is parked at intake and unparked (parking.go's
// flood); the "steady" ones publish while the worker runs, at
// steadyRate jobs/s, under what it can take, as jobs arrive in a
// deployment that keeps up.
func BenchmarkPipelineFromIntake(b *testing.B) {
	for _, v := range []struct {
		name       string
		direct     bool
		storeDelay time.Duration
		rate       int
	}{
		{"lanes", false, 0, 0}, {"direct", true, 0, 0}, {"direct_two_writes", true, -1, 0},
		{"steady_direct", true, 0, steadyRate}, {"steady_direct_two_writes", true, -1, steadyRate},
	} {
		b.Run(v.name, func(b *testing.B) { benchFromIntake(b, v.direct, v.storeDelay, v.rate) })
	}
}

// steadyRate is the publish rate of the steady benchmarks: about half of
// what the pipeline takes on this machine.
const steadyRate = 2000

// publishPaced publishes jobs ids [0, n) at rate jobs/s, in bursts every
// 10 ms, the messages of a burst concurrently (each publish waits for its
// confirm).
func publishPaced(b *testing.B, pub *rabbitmq.Publisher, n, rate int) {
	ctx := context.Background()
	per := max(rate/100, 1)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < n; {
		var burst sync.WaitGroup
		for k := 0; k < per && i < n; k, i = k+1, i+1 {
			id, body := fmt.Sprintf("bench-%d", i), jobBody(fmt.Sprintf("bench-%d", i), "bench", i, nil)
			burst.Go(func() {
				if err := pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: body}); err != nil {
					b.Error(err)
				}
			})
		}
		burst.Wait()
		<-tick.C
	}
}

func benchFromIntake(b *testing.B, direct bool, storeDelay time.Duration, rate int) {
	cfgR, pub, sub := rabbitClients(b)
	h := newHarness(b, sim.Config{Models: map[string]sim.ModelConfig{"bench": {}}}, benchModels)
	h.lanes = pub
	ctx := context.Background()
	n := b.N
	if rate == 0 {
		for i := range n {
			id := fmt.Sprintf("bench-%d", i)
			require.NoError(b, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: jobBody(id, "bench", i, nil)}))
		}
	}
	intake := intakeSubscriber(b, cfgR)
	cfg := h.cfg
	cfg.Prefetch, cfg.MaxInFlight = 0, 0 // defaults
	cfg.LanesOnly, cfg.StoreDelay = !direct, storeDelay
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
	if rate > 0 {
		go publishPaced(b, pub, n, rate)
	}
	visible := awaitRows(h.pool, n, start)
	got := h.wait(n, 5*time.Minute)
	elapsed := time.Since(start)
	finish()
	b.StopTimer()
	cpu.Report(b, n, "consumer")
	// How the jobs went: taken directly (of which written once, finished),
	// or parked at intake and unparked.
	for _, o := range []string{"direct", "written_once", "unparked"} {
		b.ReportMetric(counted(b, h.reg, "llmq_worker_jobs_total", "outcome", o)/float64(n), o+"/job")
	}
	stop()
	cancel()
	require.NoError(b, <-done)
	require.Equal(b, n, got["succeeded"])
	b.ReportMetric(float64(n)/elapsed.Seconds(), "jobs/s")
	b.ReportMetric((<-visible).Seconds(), "visible_s")
}

// awaitRows reports, from start, when the jobs table first holds n rows:
// the last job of the backlog visible by its id. It polls every 20 ms;
// a failed poll reports -1 ns.
func awaitRows(pool *pgxpool.Pool, n int, start time.Time) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	go func() {
		for {
			var c int
			err := pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs`).Scan(&c)
			if err != nil {
				out <- -1 // shows as a negative figure
				return
			}
			if c >= n {
				out <- time.Since(start)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return out
}

func intakeSubscriber(tb testing.TB, cfg rabbitmq.Config) *rabbitmq.Subscriber {
	tb.Helper()
	s, err := rabbitmq.NewIntakeSubscriber(context.Background(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = s.Close() })
	return s
}
