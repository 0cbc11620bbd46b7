package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
	pool := staleStatistics(t)
	running := []string{string(job.StatusQueued), string(job.StatusRetrying)}
	for name, plan := range map[string]string{
		"claim": explain(t, pool, store.ClaimBatchSQL, []string{"t"}, []string{"q-7"}, "w1", int64(60e6), running),
		"complete": explain(t, pool, store.CompleteBatchSQL, []string{"t"}, []string{"q-7"}, []string{"w1"}, []int32{1},
			[]string{"qwen-plus"}, []int32{1}, []int32{1}, []string{string(job.StatusRunning)}, []string{"{}"}, []string{"{}"}),
	} {
		assert.Contains(t, plan, "jobs_pkey", "%s:\n%s", name, plan)
		assert.NotContains(t, plan, "jobs_backlog_idx", "%s:\n%s", name, plan)
	}
}

// The same statistics: the statements that look for parked rows of a
// group (the intake's probe, one per group of the batch, and the
// unparker's takes and locks) must reach them through jobs_parked_idx,
// keyed by the group, not read the backlog.
func TestParkedProbesIgnoreStaleStatistics(t *testing.T) {
	t.Parallel()
	pool := staleStatistics(t)
	const n = 50
	text := func(v string) []string { return slices.Repeat([]string{v}, n) }
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("new-%d", i)
	}
	since := time.Now().Add(-time.Minute)
	for name, plan := range map[string]string{
		"insert": explain(t, pool, store.InsertBatchSQL, text("t"), ids, text("qwen-plus"), text("[]"), text("normal"),
			slices.Repeat([]*time.Time{&since}, n), false, make([]int32, n), make([]*time.Time, n), text(""), text(""), text(""), text(""),
			text(""), text(""), make([]bool, n), "w1", int64(60e6), text(""), make([]bool, n), text("null"), text(`{"messages": []}`)),
		"unpark and claim": explain(t, pool, store.UnparkClaimingSQL, "t", "qwen-plus", "w1", int64(60e6), "normal", 50, nil),
		"unpark":           explain(t, pool, store.UnparkSQL, "t", "qwen-plus", "normal", 50),
		"lock":             explain(t, pool, store.LockParkedSQL, "t", "qwen-plus", "normal", 50, nil),
	} {
		assert.Contains(t, plan, "Index Cond: ((tenant = ", "%s:\n%s", name, plan)
		assert.Contains(t, plan, "jobs_parked_idx", "%s:\n%s", name, plan)
		assert.NotContains(t, plan, "jobs_backlog_idx", "%s:\n%s", name, plan)
	}
}

// The intake looks for a group's parked jobs once per group of its batch,
// not once per row: each probe walks past the index entries it cannot see,
// which are many while a group is parking. Run for real (EXPLAIN ANALYZE in
// a transaction rolled back), a batch of 50 rows of two groups probes
// jobs_parked_idx in two loops.
func TestParkedProbeOncePerGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := staleStatistics(t)
	const n = 50
	text := func(v string) []string { return slices.Repeat([]string{v}, n) }
	ids, tenants := make([]string, n), make([]string, n)
	for i := range ids {
		ids[i], tenants[i] = fmt.Sprintf("new-%d", i), []string{"t", "u"}[i%2]
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	plan := explain(t, tx, "(ANALYZE, COSTS OFF, TIMING OFF) "+store.InsertBatchSQL, tenants, ids, text("qwen-plus"), text("[]"), text("normal"),
		make([]*time.Time, n), false, slices.Repeat([]int32{3}, n), make([]*time.Time, n), text(""), text(""), text(""), text(""),
		text(""), text(""), make([]bool, n), "w1", int64(60e6), text("chat"), make([]bool, n), text("null"), text(`{"messages": []}`))
	var probe string
	for _, line := range strings.Split(plan, "\n") {
		if strings.Contains(line, "jobs_parked_idx") {
			probe = line
		}
	}
	require.NotEmpty(t, probe, "no probe of jobs_parked_idx:\n%s", plan)
	assert.Contains(t, probe, "loops=2)", "plan:\n%s", plan)
	var parked int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE id LIKE 'new-%' AND parked_at IS NOT NULL`).Scan(&parked))
	assert.Equal(t, n/2, parked, "tenant t has parked jobs, u has none")
}

// The same statistics: the reconciler's sweep for jobs without a message
// reads jobs_unenqueued_idx, which holds only them, not the whole backlog
// through jobs_backlog_idx, whose predicate its status test also implies.
// TakeUnenqueued runs it with sorts disabled; with them, the plan reads
// the backlog index (checked).
func TestUnenqueuedSweepIgnoresStaleStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := staleStatistics(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL enable_sort = off")
	require.NoError(t, err)
	plan := explain(t, tx, store.TakeUnenqueuedSQL, 100, "normal")
	assert.Contains(t, plan, "jobs_unenqueued_idx", plan)
	assert.NotContains(t, plan, "jobs_backlog_idx", plan)
}

// staleStatistics gathers statistics while nothing waits (2,000 finished
// jobs), then queues 5,000 jobs and parks 500: the planner believes the
// partial indexes on unfinished rows hold one row.
func staleStatistics(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	_, pool := newStore(t)
	for _, q := range []string{
		`INSERT INTO jobs (tenant, id, model, request, status, attempts, started_at, completed_at, model_used, response)
			SELECT 't', 'done-' || g, 'qwen-plus', '{"messages": []}', 'succeeded', 1, now(), now(), 'qwen-plus', '{}'
			FROM generate_series(1, 2000) g`,
		`ANALYZE jobs`,
		`INSERT INTO jobs (tenant, id, model, request) SELECT 't', 'q-' || g, 'qwen-plus', '{"messages": []}' FROM generate_series(1, 5000) g`,
		`INSERT INTO jobs (tenant, id, model, request, parked_at)
			SELECT 't', 'p-' || g, 'qwen-plus', '{"messages": []}', now() FROM generate_series(1, 500) g`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	return pool
}
