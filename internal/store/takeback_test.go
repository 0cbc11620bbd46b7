package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// The pin and the read of a re-submission run in two snapshots: a job
// whose creator committed between them was read unseen and unpinned,
// answered as stored, and then deleted by its creator's take-back. Such a
// job is pinned and read once more now. The pin is held up here by a
// second key another transaction has locked, so that the creator's commit
// lands inside the window.
func TestResubmittedPinsAJobCommittedDuringThePin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	y := apiTestJob("acme", "y")
	mustInsert(t, s, y)
	x := apiTestJob("acme", "x")

	hold, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = hold.Exec(ctx, `SELECT 1 FROM jobs WHERE tenant = 'acme' AND id = 'y' FOR UPDATE`)
	require.NoError(t, err)
	creator, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = creator.Exec(ctx, `INSERT INTO jobs (tenant, id, model, request, enqueued_at) VALUES ('acme', 'x', 'qwen-plus', '{"messages": []}', now())`)
	require.NoError(t, err)

	type out struct {
		recs map[job.Key]store.Record
		err  error
	}
	done := make(chan out, 1)
	go func() {
		r, err := s.ResubmittedMany(ctx, []job.Key{x.Key(), y.Key()})
		done <- out{r, err}
	}()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'UPDATE jobs SET updated_at%'`).Scan(&waiting))
		return waiting > 0
	}, time.Minute, 5*time.Millisecond, "the pin waits for y")
	require.NoError(t, creator.Commit(ctx)) // x committed after the pin's snapshot
	require.NoError(t, hold.Rollback(ctx))
	o := <-done
	require.NoError(t, o.err)
	require.Contains(t, o.recs, x.Key(), "x is answered as stored")

	kept, err := s.Unsubmit(ctx, []job.Key{x.Key()})
	require.NoError(t, err)
	assert.Equal(t, []job.Key{x.Key()}, kept, "a job answered as stored is not taken back")
	mustGet(t, s, x.Key())
}
