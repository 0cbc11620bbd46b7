package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
)

// TestTenantBacklog counts each tenant's queued, retrying and running jobs
// per lane, from an index-only scan of jobs_backlog_idx.
func TestTenantBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	for _, j := range []struct {
		tenant, id string
		lane       job.Priority
		status     job.Status
	}{
		{"acme", "q1", job.PriorityNormal, job.StatusQueued},
		{"acme", "q2", job.PriorityNormal, job.StatusQueued},
		{"acme", "r1", job.PriorityHigh, job.StatusRunning},
		{"acme", "done", job.PriorityHigh, job.StatusSucceeded},
		{"globex", "y1", job.PriorityLow, job.StatusRetrying},
		{"globex", "c1", job.PriorityLow, job.StatusCancelled},
		{"initech", "d1", job.PriorityNormal, job.StatusDead},
	} {
		sj := sampleJob(j.tenant, j.id)
		sj.Priority = j.lane
		mustInsert(t, s, sj)
		forceStatus(t, pool, job.Key{Tenant: j.tenant, ID: j.id}, j.status)
	}
	got, err := s.TenantBacklog(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]map[job.Priority]int64{
		"acme":   {job.PriorityNormal: 2, job.PriorityHigh: 1},
		"globex": {job.PriorityLow: 1},
	}, got, "finished jobs and tenants with none are absent")

	// The count reads the unfinished rows through the partial index
	// jobs_backlog_idx, never the finished ones: its cost follows the
	// backlog, not the table.
	_, err = pool.Exec(ctx, "VACUUM ANALYZE jobs")
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	_, err = tx.Exec(ctx, "SET LOCAL enable_seqscan = off")
	require.NoError(t, err)
	assert.Contains(t, explain(t, tx, `SELECT tenant, priority, count(*) FROM jobs
		WHERE status IN ('queued', 'running', 'retrying') GROUP BY priority, tenant`), "jobs_backlog_idx")
}
