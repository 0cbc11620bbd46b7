package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/job"
)

// Parking keeps a tenant's flood in Postgres instead of in the lanes
// (migrations/00023_parking.sql, docs/design.md#tenants): a consumer that
// already holds enough of a tenant's jobs parks the rest of what it reads,
// and publishes parked rows again when it has room for that tenant.

// Park marks each queued job of keys as parked: no message (its delivery is
// acked next) and waiting in Postgres for Unpark. It returns, per key,
// whether the job was parked; a job in any other status (running under a
// live claim, retrying, finished) is not touched and its delivery takes the
// usual way.
func (s *Store) Park(ctx context.Context, keys []job.Key) ([]bool, error) {
	out, err := s.updateKeys(ctx, "park", keys, `UPDATE jobs SET parked_at = now(), enqueued_at = NULL
		FROM unnest($1::text[], $2::text[]) AS k(tenant, id)
		WHERE `+byKey("k", "jobs.status = 'queued'")+`
		RETURNING jobs.tenant, jobs.id`)
	if err != nil {
		return nil, err
	}
	if slices.Contains(out, true) {
		s.cursors.dropAll() // parked again, maybe before a group's cursor
	}
	return out, nil
}

// ParkClaimed hands jobs that owner claimed but has not called yet back
// to queued, parked, giving their attempt back (as Release does), and
// returns per key whether it did: a consumer that holds more of a
// tenant's jobs than its share returns the excess, so that their prefetch
// slots carry other tenants' messages.
func (s *Store) ParkClaimed(ctx context.Context, keys []job.Key, owner string) ([]bool, error) {
	out, err := s.updateKeys(ctx, "park claimed", keys, `UPDATE jobs SET `+releaseSet+`, parked_at = now(), enqueued_at = NULL
		FROM unnest($1::text[], $2::text[]) AS k(tenant, id)
		WHERE `+byKey("k", "jobs.status = 'running' AND jobs.lease_owner = $3 AND jobs.status = ANY($4)")+`
		RETURNING jobs.tenant, jobs.id`, owner, guard(job.StatusQueued))
	if err != nil {
		return nil, err
	}
	if slices.Contains(out, true) {
		s.cursors.dropAll() // parked again, maybe before a group's cursor
	}
	return out, nil
}

// ParkedGroup names the parked jobs of one tenant, model and lane.
type ParkedGroup struct {
	Tenant string
	Model  string
	Lane   job.Priority
}

// ParkedGroups lists every (tenant, model, lane) that has parked jobs. It
// reads one index entry per group (a skip scan over jobs_parked_idx), so
// its cost grows with the number of groups, not with the parked jobs.
func (s *Store) ParkedGroups(ctx context.Context) ([]ParkedGroup, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rows, err := s.pool.Query(ctx, `WITH RECURSIVE g AS (
			(SELECT tenant, model, priority FROM jobs
			 WHERE parked_at IS NOT NULL
			 ORDER BY tenant, model, priority LIMIT 1)
			UNION ALL
			SELECT n.tenant, n.model, n.priority FROM g, LATERAL (
				SELECT tenant, model, priority FROM jobs
				WHERE parked_at IS NOT NULL
				  AND (tenant, model, priority) > (g.tenant, g.model, g.priority)
				ORDER BY tenant, model, priority LIMIT 1) n
		) SELECT tenant, model, priority FROM g`)
	if err != nil {
		return nil, fmt.Errorf("list parked groups: %w", err)
	}
	defer rows.Close()
	var out []ParkedGroup
	for rows.Next() {
		var g ParkedGroup
		var lane string
		if err := rows.Scan(&g.Tenant, &g.Model, &lane); err != nil {
			return nil, fmt.Errorf("list parked groups: %w", err)
		}
		g.Lane = job.Priority(lane)
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list parked groups: %w", err)
	}
	return out, nil
}

// Unpark takes up to limit parked jobs of g, oldest first, and records
// that a message for each is about to be published (enqueued_at set,
// parked_at cleared). The caller publishes them; one whose publish fails is
// handed to the reconciler with MarkUnenqueued. Replicas unparking the same
// group at once take disjoint rows.
func (s *Store) Unpark(ctx context.Context, g ParkedGroup, limit int) ([]job.Key, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var keys []job.Key
	err := s.gated(ctx, g, func(conn *pgxpool.Conn) error {
		rows, err := conn.Query(ctx, unparkSQL, g.Tenant, g.Model, string(g.Lane), limit)
		if err == nil {
			keys, err = collectKeyList(rows)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("unpark jobs of tenant %s: %w", g.Tenant, err)
	}
	return keys, nil
}

// A CTE, not IN (subquery): the planner may run an IN subquery once per
// candidate row, and each run would take another limit's worth.
var unparkSQL = `WITH c AS MATERIALIZED (
		SELECT tenant, id FROM jobs
		WHERE parked_at IS NOT NULL AND tenant = $1 AND model = $2 AND priority = $3
		ORDER BY created_at LIMIT $4 FOR UPDATE SKIP LOCKED)
	UPDATE jobs SET parked_at = NULL, enqueued_at = now()
	FROM c WHERE ` + byKey("c", "jobs.status = 'queued'") + `
	RETURNING jobs.tenant, jobs.id`

// unparkClaimingSQL claims the oldest parked jobs of a group ($1 tenant,
// $2 model, $5 lane, $6 how many) for owner $3 under a lease of $4 µs, as
// the direct intake stores its jobs: running, with no message
// (enqueued_at NULL; if the owner dies, the reconciler publishes one when
// the lease has expired, store.TakeOrphaned). $7, when not NULL, is where
// the scan starts (parkcursor.go).
var unparkClaimingSQL = `WITH c AS MATERIALIZED (
		SELECT tenant, id FROM jobs
		WHERE parked_at IS NOT NULL AND tenant = $1 AND model = $2 AND priority = $5
			AND created_at >= coalesce($7::timestamptz, '-infinity')
		ORDER BY created_at LIMIT $6 FOR UPDATE SKIP LOCKED)
	UPDATE jobs SET ` + claimSet + `, enqueued_at = NULL
	FROM c WHERE ` + byKey("c", "jobs.status = 'queued' AND jobs.attempts < jobs.max_attempts") + `
	RETURNING ` + qualifiedJobColumns

// UnparkClaiming is Unpark for a caller that runs the jobs itself: it takes
// up to limit parked jobs of g, oldest first, and claims them for owner
// under lease in the same statement, so they need no message, no delivery
// and no claim of their own. Replicas unparking the same group at once
// take disjoint rows.
func (s *Store) UnparkClaiming(ctx context.Context, g ParkedGroup, limit int, owner string, lease time.Duration) ([]Record, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var recs []Record
	err := s.gated(ctx, g, func(conn *pgxpool.Conn) error {
		var err error
		recs, err = s.fromCursor(g, limit, func(start *time.Time) ([]Record, error) {
			rows, err := conn.Query(ctx, unparkClaimingSQL, g.Tenant, g.Model, owner, leaseMicros(lease), string(g.Lane), limit, start)
			if err != nil {
				return nil, err
			}
			return collectRecords(rows)
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("unpark and claim jobs of tenant %s: %w", g.Tenant, err)
	}
	return recs, nil
}

func collectKeyList(rows pgx.Rows) ([]job.Key, error) {
	defer rows.Close()
	var out []job.Key
	for rows.Next() {
		var k job.Key
		if err := rows.Scan(&k.Tenant, &k.ID); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// updateKeys runs sql, an UPDATE of the jobs named by keys ($1 their
// tenants, $2 their ids, args from $3) that returns jobs.tenant and
// jobs.id, and reports per key whether its row changed; what names the
// change in an error.
func (s *Store) updateKeys(ctx context.Context, what string, keys []job.Key, sql string, args ...any) ([]bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	if len(keys) == 0 {
		return nil, nil
	}
	tenants, ids := keyArrays(keys)
	rows, err := s.pool.Query(ctx, sql, append([]any{tenants, ids}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("%s %d jobs: %w", what, len(keys), err)
	}
	out, err := keysReturned(keys, rows)
	if err != nil {
		return nil, fmt.Errorf("%s %d jobs: %w", what, len(keys), err)
	}
	return out, nil
}

// keysReturned reports, per key, whether rows (tenant, id of the rows a
// statement changed) name it.
func keysReturned(keys []job.Key, rows pgx.Rows) ([]bool, error) {
	list, err := collectKeyList(rows)
	if err != nil {
		return nil, err
	}
	changed := make(map[job.Key]struct{}, len(list))
	for _, k := range list {
		changed[k] = struct{}{}
	}
	out := make([]bool, len(keys))
	for i, k := range keys {
		_, out[i] = changed[k]
	}
	return out, nil
}
