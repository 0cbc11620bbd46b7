package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// TenantBacklog counts the jobs each tenant has queued, retrying or
// running, per lane; tenants with none are absent. One index-only scan of
// the partial index jobs_backlog_idx on (priority, tenant) (migration 00024) answers it.
func (s *Store) TenantBacklog(ctx context.Context) (map[string]map[job.Priority]int64, error) {
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
