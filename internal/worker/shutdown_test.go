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

// Jobs that wait in a dispatcher for a quota when the worker stops are
// handed back together (handBackAll): each is queued again with its
// attempt given back, its message is back on the broker, and a worker
// started afterwards runs every one of them once.
func TestShutdownHandsBackWaitingJobs(t *testing.T) {
	t.Parallel()
	const n = 40
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"slow": {}}},
		map[string]config.Model{"slow": {Strategy: "ratelimit", RPM: 1}})
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	bodies := map[string][]byte{}
	list := make([][]byte, 0, n)
	for i := range n {
		id := fmt.Sprintf("wait-%d", i)
		bodies[id] = jobBody(id, "slow", i, nil)
		list = append(list, bodies[id])
	}
	h.submitMany(mem.Publisher(), list)
	cfg := h.cfg
	cfg.TenantHold = -1 // no parking: every job waits in the dispatcher
	sub := mem.Subscriber()
	_, stop := h.start(sub, cfg)
	require.Equal(t, map[string]int{"succeeded": 1}, h.wait(1, 30*time.Second), "the quota admits one call")
	ctx := context.Background()
	require.Eventually(t, func() bool {
		var running int
		require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = 'running'`).Scan(&running))
		return running == n-1
	}, 30*time.Second, 10*time.Millisecond, "the others claimed, waiting for the quota")
	stop()
	require.NoError(t, sub.Close())

	var queued, attempts int
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(attempts), 0) FROM jobs WHERE status = 'queued'`).Scan(&queued, &attempts))
	require.Equal(t, n-1, queued, "every waiting job is queued again")
	require.Zero(t, attempts, "their attempts, which never reached the provider, are given back")

	fast := map[string]config.Model{"slow": {Strategy: "retry"}}
	h.models = fast
	cfg = h.cfg
	cfg.Models = fast
	h.start(mem.Subscriber(), cfg)
	require.Equal(t, map[string]int{"succeeded": n - 1}, h.wait(n-1, time.Minute), "their messages came back")
	h.checkResults(ctx, bodies)
	var calls int
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = $1 AND attempts = 1`, job.StatusSucceeded).Scan(&calls))
	require.Equal(t, n, calls, "each job ran once")
}
