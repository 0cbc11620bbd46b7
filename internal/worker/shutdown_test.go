package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
)

// Jobs that wait in a dispatcher for a quota when the worker stops are
// handed back together (handBackAll): each is queued again with its
// attempt given back, its message is back on the broker, and a worker
// started afterwards runs every one of them once.
func TestShutdownHandsBackWaitingJobs(t *testing.T) {
	t.Parallel()
	const n = 40
	h, mem, sub, bodies := waitingForQuota(t, n, "wait")
	require.Equal(t, map[string]int{"succeeded": 1}, h.wait(1, 30*time.Second), "the quota admits one call")
	h.stop()
	require.NoError(t, sub.Close())

	ctx := context.Background()
	var queued, attempts int
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(attempts), 0) FROM jobs WHERE status = 'queued'`).Scan(&queued, &attempts))
	require.Equal(t, n-1, queued, "every waiting job is queued again")
	require.Zero(t, attempts, "their attempts, which never reached the provider, are given back")

	fast := map[string]config.Model{"slow": {Strategy: "retry"}}
	h.models = fast
	cfg := h.cfg
	cfg.Models = fast
	h.start(mem.Subscriber(), cfg)
	require.Equal(t, map[string]int{"succeeded": n - 1}, h.wait(n-1, time.Minute), "their messages came back")
	h.checkResults(ctx, bodies)
	require.Equal(t, n, h.countJobs(t, "status = $1 AND attempts = 1", job.StatusSucceeded), "each job ran once")
}

// waitingForQuota stores n jobs (ids prefix-0 …) of a model whose quota
// admits one call a minute, publishes them on a memory broker's lanes and
// starts a worker on sub with parking off and room for all of them (h.stop
// stops it): it returns once the first job has run and the others are claimed,
// waiting in the dispatcher. bodies are the jobs' messages by id.
func waitingForQuota(tb testing.TB, n int, prefix string) (h *harness, mem *memory.Broker, sub broker.Subscriber, bodies map[string][]byte) {
	tb.Helper()
	h = newHarness(tb, sim.Config{Models: map[string]sim.ModelConfig{"slow": {}}},
		map[string]config.Model{"slow": {Strategy: "ratelimit", RPM: 1}})
	mem = memory.New(memory.Config{})
	tb.Cleanup(func() { mem.Close() })
	bodies = map[string][]byte{}
	list := make([][]byte, 0, n)
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		bodies[id] = jobBody(id, "slow", i, nil)
		list = append(list, bodies[id])
	}
	h.submitMany(mem.Publisher(), list)
	cfg := h.cfg
	cfg.TenantHold = -1 // no parking: every job waits in the dispatcher
	cfg.Prefetch = max(cfg.Prefetch, n)
	cfg.MaxInFlight = max(cfg.MaxInFlight, 2*n)
	sub = mem.Subscriber()
	h.start(sub, cfg)
	awaitStatus(tb, h, job.StatusRunning, n-1, "the first job run, the others claimed and waiting for the quota")
	return h, mem, sub, bodies
}

// awaitStatus waits until n jobs have status.
func awaitStatus(tb testing.TB, h *harness, status job.Status, n int, what string) {
	tb.Helper()
	require.Eventually(tb, func() bool { return countStatus(tb, h, status) == n }, time.Minute, 10*time.Millisecond, what)
}

// countStatus is how many jobs have status.
func countStatus(tb testing.TB, h *harness, status job.Status) int {
	tb.Helper()
	return h.countJobs(tb, "status = $1", status)
}
