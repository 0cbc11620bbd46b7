package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// Statistics gathered while nothing waited, then a flood: the planner
// believes the partial indexes on unfinished rows hold one row. The keyed
// statements of the hot path must still reach their rows through the
// primary key, not scan the backlog once per statement (byKey).
func TestKeyedStatementsIgnoreStaleStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := newStore(t)
	_, err := pool.Exec(ctx, `INSERT INTO jobs (tenant, id, model, request, status, attempts, started_at, completed_at, model_used, response)
		SELECT 't', 'done-' || g, 'qwen-plus', '{"messages": []}', 'succeeded', 1, now(), now(), 'qwen-plus', '{}'
		FROM generate_series(1, 2000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE jobs`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO jobs (tenant, id, model, request)
		SELECT 't', 'q-' || g, 'qwen-plus', '{"messages": []}' FROM generate_series(1, 5000) g`)
	require.NoError(t, err)

	running := []string{string(job.StatusQueued), string(job.StatusRetrying)}
	for name, plan := range map[string]string{
		"claim": explain(t, pool, store.ClaimBatchSQL, []string{"t"}, []string{"q-7"}, "w1", int64(60e6), running),
		"complete": explain(t, pool, store.CompleteBatchSQL, []string{"t"}, []string{"q-7"}, []string{"w1"}, []int32{1},
			[]string{"qwen-plus"}, []string{"{}"}, []int32{1}, []int32{1}, []string{string(job.StatusRunning)}, []string{"{}"}),
	} {
		assert.Contains(t, plan, "jobs_pkey", "%s:\n%s", name, plan)
		assert.NotContains(t, plan, "jobs_backlog_idx", "%s:\n%s", name, plan)
	}
}
