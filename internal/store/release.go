package store

import (
	"context"
	"fmt"

	"github.com/llmq/llmq/internal/job"
)

// releaseSet is what a claim handed back sets: queued, the attempt given
// back, no lease (Release, ReleaseBatch and ParkClaimed).
const releaseSet = `status = 'queued', attempts = greatest(jobs.attempts - 1, 0),
			lease_owner = NULL, lease_expires_at = NULL, updated_at = now()`

// Release hands a running job that owner holds back to queued (shutdown)
// and gives the attempt back (attempts-1): release only attempts that
// never reached the provider. It returns false when owner holds no lease.
func (s *Store) Release(ctx context.Context, key job.Key, owner string) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	tag, err := s.pool.Exec(ctx, `UPDATE jobs SET `+releaseSet+`
		WHERE tenant = $1 AND id = $2 AND lease_owner = $3 AND status = ANY($4)`,
		key.Tenant, key.ID, owner, guard(job.StatusQueued))
	if err != nil {
		return false, fmt.Errorf("release job %s: %w", key.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseBatch is Release for many jobs in one statement (a shutdown hands
// back every job waiting in its dispatchers at once); out[i] reports
// whether keys[i] was released.
func (s *Store) ReleaseBatch(ctx context.Context, keys []job.Key, owner string) ([]bool, error) {
	return s.updateKeys(ctx, "release", keys, `UPDATE jobs SET `+releaseSet+`
		FROM unnest($1::text[], $2::text[]) AS k(tenant, id)
		WHERE `+byKey("k", "jobs.lease_owner = $3 AND jobs.status = ANY($4)")+`
		RETURNING jobs.tenant, jobs.id`, owner, guard(job.StatusQueued))
}
