package store

import (
	"context"
	"fmt"

	"github.com/llmq/llmq/internal/job"
)

// SetTaskID records the provider's task id of a task job that owner holds
// running, before the task is polled (docs/design.md#kinds): a consumer
// that takes the job over later polls this task instead of submitting
// another. It reports false when owner no longer holds the job.
func (s *Store) SetTaskID(ctx context.Context, key job.Key, owner, taskID string) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	tag, err := s.pool.Exec(ctx, `UPDATE jobs SET task_id = $3, updated_at = now()
		WHERE tenant = $1 AND id = $2 AND lease_owner = $4 AND status = 'running'`, key.Tenant, key.ID, taskID, owner)
	if err != nil {
		return false, fmt.Errorf("set task id of job %s: %w", key.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}
