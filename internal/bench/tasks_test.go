package bench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/testsvc"
)

// The tasks scenario on short tasks: with max_concurrency at the
// provider's running-task limit, auto and ratelimit run every job with one
// submission each, no 429 and no overrun; the naive retry client, with
// more workers than the limit, gets 429s but never an overrun.
func TestTasksBench(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three strategies over Postgres: not in -short")
	}
	sc := TasksScenario{Jobs: 12, Running: 3, TaskDuration: 300 * time.Millisecond, Spread: 0.3, RPM: 6000, Workers: 6,
		PollIntervals: []time.Duration{100 * time.Millisecond},
		Strategies:    []ratecontrol.Strategy{ratecontrol.StrategyRetry, ratecontrol.StrategyRateLimit, ratecontrol.StrategyAuto},
		Timeout:       time.Minute}
	res, err := RunTasks(context.Background(), Env{PostgresURL: testsvc.PostgresEmptyURL(t)}, sc)
	require.NoError(t, err)
	require.Len(t, res, 3)
	for _, r := range res {
		require.Zero(t, r.Overruns, r.Strategy)
		require.LessOrEqual(t, r.PeakRunning, sc.Running, r.Strategy)
		require.Equal(t, sc.Jobs, r.Jobs, r.Strategy)
		require.Greater(t, r.Occupancy, 0.0, r.Strategy)
		require.LessOrEqual(t, r.Occupancy, 1.0, r.Strategy)
		require.GreaterOrEqual(t, r.PollsPerTask, 1.0, r.Strategy)
		require.Equal(t, r.Submitted+r.RateLimited, r.Submissions, r.Strategy)
		if r.Strategy == string(ratecontrol.StrategyRetry) {
			continue
		}
		require.Equal(t, sc.Jobs, r.Succeeded, r.Strategy)
		require.EqualValues(t, sc.Jobs, r.Submissions, "%s: one submission a job", r.Strategy)
		require.Zero(t, r.RateLimited, r.Strategy)
	}
	var out bytes.Buffer
	PrintTasks(&out, sc, res)
	t.Log("\n" + out.String())
	require.Contains(t, out.String(), "occupancy")
}
