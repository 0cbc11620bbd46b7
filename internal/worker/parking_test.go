package worker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
)

// Two replicas with a small hold under a rate limit: a flood of one tenant
// and the jobs of another are parked and unparked many times over, and
// every job still succeeds exactly once, with nothing left parked.
func TestParkingLosesNothing(t *testing.T) {
	t.Parallel()
	models := map[string]config.Model{"qwen-plus": {RPS: 150}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"qwen-plus": {RPS: 150}}}, models)
	mem := memory.New(memory.Config{})
	pub := mem.Publisher()
	ctx := context.Background()

	var jobs []job.Job
	for i := range 1200 {
		tenant := "flood"
		if i%4 == 0 {
			tenant = "steady"
		}
		jobs = append(jobs, job.Job{ID: fmt.Sprintf("%s-%d", tenant, i), Tenant: tenant, Model: "qwen-plus", Priority: job.PriorityNormal,
			Request: []byte(fmt.Sprintf(`{"messages":[{"role":"user","content":"ticket %d"}],"max_tokens":8}`, i))})
	}
	for i := range jobs {
		jobs[i].Normalize()
	}
	res, err := h.store.InsertBatch(ctx, jobs)
	require.NoError(t, err)
	for i, r := range res {
		require.True(t, r.Created)
		require.NoError(t, pub.Publish(ctx, job.PriorityNormal, broker.WakeUp(jobs[i].Key(), jobs[i].Model)))
	}

	cfg := h.cfg
	cfg.Prefetch, cfg.TenantHold = 40, 4
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	var wg sync.WaitGroup
	runCtx, cancel := context.WithCancel(ctx)
	for i, reg := range regs {
		c := cfg
		c.Owner = fmt.Sprintf("replica-%d", i)
		w, err := New(c, Deps{Store: h.ns, Subscriber: mem.Subscriber(), Provider: h.call, Lanes: pub,
			Governor: GovernorFactory(models, "auto"), Logger: testLogger(t), Registerer: reg})
		require.NoError(t, err)
		wg.Go(func() { require.NoError(t, w.Run(runCtx)) })
	}
	got := h.wait(len(jobs), 2*time.Minute)
	cancel()
	wg.Wait()
	require.Equal(t, map[string]int{"succeeded": len(jobs)}, got)

	var parked, unparked float64
	for _, reg := range regs {
		parked += jobsCounted(t, reg, "parked")
		unparked += jobsCounted(t, reg, "unparked")
	}
	require.Positive(t, parked, "a hold of 4 under a rate limit must park")
	require.Positive(t, unparked)
	var left, notDone int
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE parked_at IS NOT NULL), count(*) FILTER (WHERE status <> 'succeeded') FROM jobs`).Scan(&left, &notDone))
	require.Zero(t, left)
	require.Zero(t, notDone)
}

// jobsCounted reads llmq_worker_jobs_total{outcome} from reg.
func jobsCounted(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	t.Helper()
	return counted(t, reg, "llmq_worker_jobs_total", "outcome", outcome)
}
