package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestGetMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	for _, id := range []string{"a", "b", "c"} {
		mustInsert(t, s, sampleJob("acme", id))
	}
	mustInsert(t, s, sampleJob("globex", "d"))

	recs, err := s.GetMany(ctx, "acme", []string{"c", "nope", "a", "d", "c"})
	require.NoError(t, err)
	require.Len(t, recs, 2, "unknown ids, other tenants' jobs and repeats are absent")
	assert.Equal(t, "c", recs[0].ID, "in the order asked")
	assert.Equal(t, "a", recs[1].ID)
	assert.JSONEq(t, `{"ticket": 4711}`, string(recs[0].Metadata))

	recs, err = s.GetMany(ctx, "acme", nil)
	require.NoError(t, err)
	assert.Empty(t, recs)
	_, err = s.GetMany(ctx, "acme", make([]string, store.MaxGetMany+1))
	assert.Error(t, err)
}

// feedAll reads the feed from cursor to its current end, returning the
// ids and the cursor to continue from.
func feedAll(t *testing.T, s *store.Store, tenant, cursor string, statuses ...job.Status) ([]string, string) {
	t.Helper()
	var ids []string
	for {
		recs, next, err := s.Feed(context.Background(), store.FeedFilter{Tenant: tenant, After: cursor, Limit: 2, Statuses: statuses})
		require.NoError(t, err)
		require.NotEmpty(t, next, "the feed always returns a cursor")
		for _, r := range recs {
			require.True(t, r.Status.Terminal(), "%s is %s", r.ID, r.Status)
			ids = append(ids, r.ID)
		}
		if len(recs) == 0 {
			return ids, next
		}
		cursor = next
	}
}

// feedN is feedAll until it has at least n ids (within 30 s). The feed's
// horizon errs on the holding-back side: a transaction of another test's
// database that ends between the snapshot and the read of pg_stat_activity
// holds the feed back for that call, so a test that expects finishes reads
// until it sees them.
func feedN(t *testing.T, s *store.Store, tenant, cursor string, n int, statuses ...job.Status) ([]string, string) {
	t.Helper()
	var ids []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, next := feedAll(t, s, tenant, cursor, statuses...)
		ids, cursor = append(ids, got...), next
		if len(ids) >= n || time.Now().After(deadline) {
			return ids, cursor
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func finish(t *testing.T, pool *pgxpool.Pool, key job.Key, status job.Status) {
	t.Helper()
	forceStatus(t, pool, key, status)
}

func TestFeedOrderAndFilter(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	for i := range 5 {
		mustInsert(t, s, sampleJob("acme", fmt.Sprintf("j%d", i)))
	}
	mustInsert(t, s, sampleJob("globex", "g"))
	ids, cursor := feedAll(t, s, "acme", "")
	assert.Empty(t, ids, "nothing finished yet")

	for _, f := range []struct {
		id     string
		status job.Status
	}{{"j3", job.StatusSucceeded}, {"j1", job.StatusFailed}, {"j4", job.StatusCancelled}} {
		finish(t, pool, job.Key{Tenant: "acme", ID: f.id}, f.status)
	}
	finish(t, pool, job.Key{Tenant: "globex", ID: "g"}, job.StatusSucceeded)
	// An older transaction of another database cannot write these jobs
	// and does not hold the feed back.
	other, err := testsvc.Postgres(t).Begin(context.Background())
	require.NoError(t, err)
	defer other.Rollback(context.Background()) //nolint:errcheck // never commits
	_, err = other.Exec(context.Background(), "SELECT pg_current_xact_id()")
	require.NoError(t, err)
	finish(t, pool, job.Key{Tenant: "acme", ID: "j0"}, job.StatusDead)
	ids, next := feedN(t, s, "acme", cursor, 4)
	assert.Equal(t, []string{"j3", "j1", "j4", "j0"}, ids, "in the order they finished, the tenant's only")
	more, _ := feedAll(t, s, "acme", next)
	assert.Empty(t, more, "nothing repeats")

	ids, _ = feedN(t, s, "acme", "", 2, job.StatusSucceeded, job.StatusCancelled)
	assert.Equal(t, []string{"j3", "j4"}, ids)
	recs, _, err := s.Feed(context.Background(), store.FeedFilter{Tenant: "acme", Limit: 1})
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.JSONEq(t, `{"ticket": 4711}`, string(recs[0].Metadata), "the full record")

	_, _, err = s.Feed(context.Background(), store.FeedFilter{Tenant: "acme", After: "not a cursor"})
	assert.ErrorIs(t, err, store.ErrBadCursor)
	_, _, err = s.Feed(context.Background(), store.FeedFilter{Tenant: "acme", Statuses: []job.Status{job.StatusQueued}})
	assert.Error(t, err)
}

// TestFeedNeverSkipsALateCommit: job A is finished by a transaction that
// stays open (its xid is the smaller), job B by one that commits after it
// began. The feed holds B back while A's transaction runs, then hands out
// A and B, in that order, each once.
func TestFeedNeverSkipsALateCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	for _, id := range []string{"a", "b"} {
		mustInsert(t, s, sampleJob("acme", id))
	}
	_, cursor := feedAll(t, s, "acme", "")

	txA, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer txA.Rollback(ctx) //nolint:errcheck // committed below
	_, err = txA.Exec(ctx, `UPDATE jobs SET status = 'cancelled', completed_at = now() WHERE tenant = 'acme' AND id = 'a'`)
	require.NoError(t, err)
	finish(t, pool, job.Key{Tenant: "acme", ID: "b"}, job.StatusSucceeded) // commits with a larger xid

	var xa string
	var older bool
	require.NoError(t, txA.QueryRow(ctx, `SELECT finished_xid::text FROM jobs WHERE id = 'a'`).Scan(&xa))
	require.NoError(t, pool.QueryRow(ctx, `SELECT $1::text::xid8 < finished_xid FROM jobs WHERE id = 'b'`, xa).Scan(&older))
	require.True(t, older, "A's transaction has the smaller xid")

	ids, held := feedAll(t, s, "acme", cursor)
	assert.Empty(t, ids, "B is held back while A's older transaction runs")
	assert.Equal(t, cursor, held, "the cursor does not move")

	require.NoError(t, txA.Commit(ctx))
	ids, next := feedN(t, s, "acme", held, 2)
	assert.Equal(t, []string{"a", "b"}, ids, "A then B, once each")
	ids, _ = feedAll(t, s, "acme", next)
	assert.Empty(t, ids)
}

// TestFeedListsAReplayedJobAgain: a job replayed and finished again is a
// new finish, listed again after the cursor.
func TestFeedListsAReplayedJobAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	key := job.Key{Tenant: "acme", ID: "again"}
	mustInsert(t, s, sampleJob(key.Tenant, key.ID))
	finish(t, pool, key, job.StatusFailed)
	ids, cursor := feedN(t, s, "acme", "", 1)
	require.Equal(t, []string{"again"}, ids)

	_, err := s.Replay(ctx, key)
	require.NoError(t, err)
	ids, cursor = feedAll(t, s, "acme", cursor)
	assert.Empty(t, ids, "queued again: not finished")
	finish(t, pool, key, job.StatusSucceeded)
	ids, _ = feedN(t, s, "acme", cursor, 1)
	assert.Equal(t, []string{"again"}, ids, "its second finish")
}

func TestAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	var last store.Record
	for i := range 6 {
		j := sampleJob(fmt.Sprintf("t%d", i%2), fmt.Sprintf("n%d", i))
		last = mustInsert(t, s, j)
	}
	high := sampleJob("t0", "h")
	high.Priority = job.PriorityHigh
	mustInsert(t, s, high)
	forceStatus(t, pool, job.Key{Tenant: "t0", ID: "n0"}, job.StatusRunning)
	forceStatus(t, pool, job.Key{Tenant: "t1", ID: "n1"}, job.StatusRetrying)
	forceStatus(t, pool, job.Key{Tenant: "t0", ID: "n2"}, job.StatusSucceeded)

	n, err := s.Ahead(ctx, job.PriorityNormal, last.CreatedAt, last.ID)
	require.NoError(t, err)
	assert.Equal(t, int64(3), n, "n1 (retrying), n3, n4 of both tenants; not running, finished, itself or the other lane")
	n, err = s.Ahead(ctx, job.PriorityNormal, time.Time{}, "")
	require.NoError(t, err)
	assert.Zero(t, n)

	// On six rows the planner rightly scans the table; with scans priced
	// out it must still be able to use jobs_backlog_idx, which it can only
	// if the status list implies the index's predicate.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	_, err = tx.Exec(ctx, "SET LOCAL enable_seqscan = off")
	require.NoError(t, err)
	assert.Contains(t, explain(t, tx, `SELECT count(*) FROM (
		SELECT 1 FROM jobs WHERE priority = 'normal' AND status IN ('queued', 'retrying')
		  AND (created_at, id) < (now(), 'x') LIMIT 100000) ahead`), "jobs_backlog_idx")
}
