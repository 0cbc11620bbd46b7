package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// TenantBacklog counts the jobs each tenant has queued, retrying or
// running, per lane; tenants with none are absent. It reads the unfinished
// rows through the partial index jobs_backlog_idx (priority), so its cost
// follows the backlog, not the table; the monitor spaces the counts by
// their cost (countBudget). An index on (priority, tenant) would make it an
// index-only scan but costs every claim and completion about 40 µs of
// Postgres CPU (BenchmarkPipeline), so the hot path does not pay for it.
func (s *Store) TenantBacklog(ctx context.Context) (map[string]map[job.Priority]int64, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rows, err := s.pool.Query(ctx, `SELECT tenant, priority, count(*) FROM jobs
		WHERE status IN ('queued', 'running', 'retrying') GROUP BY priority, tenant`)
	if err != nil {
		return nil, fmt.Errorf("tenant backlog: %w", err)
	}
	out := map[string]map[job.Priority]int64{}
	var (
		tenant, lane string
		n            int64
	)
	_, err = pgx.ForEachRow(rows, []any{&tenant, &lane, &n}, func() error {
		lanes := out[tenant]
		if lanes == nil {
			lanes = make(map[job.Priority]int64, len(job.Priorities))
			out[tenant] = lanes
		}
		lanes[job.Priority(lane)] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tenant backlog: %w", err)
	}
	return out, nil
}
