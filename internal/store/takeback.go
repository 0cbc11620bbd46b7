package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// unseenSQL holds for a job that only its creator has answered for:
// queued, never claimed, and not written since its insert (updated_at is
// still created_at). A re-submission that finds such a job pins it
// (resubmitted) before it answers "stored", so the creator's take-back
// (Unsubmit), whose publish may yet fail, can no longer delete it.
const unseenSQL = `status = 'queued' AND attempts = 0 AND started_at IS NULL AND updated_at = created_at`

// Unsubmit deletes jobs that InsertBatch created and whose message could
// not be published, so that "nothing was stored" stays true. A job is
// deleted only while it is unseen (unseenSQL); the keys it could not
// delete (claimed meanwhile through another message, or answered as stored
// to a re-submission) are returned: those jobs stay and run.
func (s *Store) Unsubmit(ctx context.Context, keys []job.Key) (kept []job.Key, err error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	if len(keys) == 0 {
		return nil, nil
	}
	tenants, ids := keyArrays(keys)
	rows, err := s.pool.Query(ctx, `DELETE FROM jobs USING unnest($1::text[], $2::text[]) AS k(tenant, id)
		WHERE jobs.tenant = k.tenant AND jobs.id = k.id AND `+unseenSQL+`
		RETURNING jobs.tenant, jobs.id`, tenants, ids)
	if err != nil {
		return nil, fmt.Errorf("unsubmit %d jobs: %w", len(keys), err)
	}
	deleted := map[job.Key]bool{}
	var k job.Key
	if _, err := pgx.ForEachRow(rows, []any{&k.Tenant, &k.ID}, func() error { deleted[k] = true; return nil }); err != nil {
		return nil, fmt.Errorf("unsubmit %d jobs: %w", len(keys), err)
	}
	for _, key := range keys {
		if !deleted[key] {
			kept = append(kept, key)
		}
	}
	return kept, nil
}

// Resubmitted reads the job of key for a re-submission that will answer it
// as stored, pinning it first (resubmitted).
func (s *Store) Resubmitted(ctx context.Context, key job.Key) (Record, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	recs, err := s.resubmitted(ctx, []job.Key{key})
	if err != nil {
		return Record{}, fmt.Errorf("read job %s: %w", key.ID, err)
	}
	rec, ok := recs[key]
	if !ok {
		return Record{}, ErrNotFound
	}
	return rec, nil
}

// resubmitted pins the unseen jobs of keys (unseenSQL), then reads every
// job of keys. The read comes after the pin, in a statement of its own, so
// that a job its creator took back before the pin is read as gone, never
// answered as stored. A job whose creator committed between the pin's
// snapshot and the read's is read unseen and unpinned: it is pinned and
// read once more (the second pin sees it, or its take-back came first and
// it reads as gone).
func (s *Store) resubmitted(ctx context.Context, keys []job.Key) (map[job.Key]Record, error) {
	recs, err := s.pinAndRead(ctx, keys)
	if err != nil {
		return nil, err
	}
	var again []job.Key
	for k, r := range recs {
		if unseen(r) {
			again = append(again, k)
		}
	}
	if len(again) == 0 {
		return recs, nil
	}
	reread, err := s.pinAndRead(ctx, again)
	if err != nil {
		return nil, err
	}
	for _, k := range again {
		if r, ok := reread[k]; ok {
			recs[k] = r
		} else {
			delete(recs, k)
		}
	}
	return recs, nil
}

// unseen is unseenSQL for a record read.
func unseen(r Record) bool {
	return r.Status == job.StatusQueued && r.Attempts == 0 && r.StartedAt == nil && r.UpdatedAt.Equal(r.CreatedAt)
}

func (s *Store) pinAndRead(ctx context.Context, keys []job.Key) (map[job.Key]Record, error) {
	tenants, ids := keyArrays(keys)
	if _, err := s.pool.Exec(ctx, `UPDATE jobs SET updated_at = now()
		FROM (SELECT k.tenant, k.id FROM unnest($1::text[], $2::text[]) AS k(tenant, id) ORDER BY k.tenant, k.id) AS k
		WHERE jobs.tenant = k.tenant AND jobs.id = k.id AND `+unseenSQL, tenants, ids); err != nil {
		return nil, fmt.Errorf("pin re-submitted jobs: %w", err)
	}
	return s.getMany(ctx, keys)
}
