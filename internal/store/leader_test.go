package store_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/store"
)

func TestTryLead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	other := store.New(pool) // another replica on the same database

	first, err := s.TryLead(ctx, store.ReconcilerLockID)
	require.NoError(t, err)
	require.NotNil(t, first)
	require.NoError(t, first.Check(ctx), "the leader's lease holds")

	for _, st := range []*store.Store{s, other} {
		second, err := st.TryLead(ctx, store.ReconcilerLockID)
		require.NoError(t, err)
		assert.Nil(t, second, "a second session does not lead while the first holds the lock")
	}
	require.NoError(t, first.Check(ctx), "a refused TryLead does not disturb the leader")

	// Another lock id is independent.
	unrelated, err := other.TryLead(ctx, store.ReconcilerLockID+1)
	require.NoError(t, err)
	require.NotNil(t, unrelated)
	unrelated.Release(ctx)

	first.Release(ctx)
	next, err := other.TryLead(ctx, store.ReconcilerLockID)
	require.NoError(t, err)
	require.NotNil(t, next, "after Release another session leads")
	require.NoError(t, next.Check(ctx))

	// A leader whose session dies loses the lease: Check says so, and the
	// lock is free for another session.
	// (pg_terminate_backend waits up to 10 s for the backend to exit.)
	var killed []bool
	rows, err := pool.Query(ctx, `SELECT pg_terminate_backend(pid, 10000) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	require.NoError(t, err)
	killed, err = pgx.CollectRows(rows, pgx.RowTo[bool])
	require.NoError(t, err)
	require.Equal(t, []bool{true}, killed, "the leader's session, and only it, is terminated")
	assert.Error(t, next.Check(ctx), "the lease of a dead session does not hold")
	next.Release(ctx)
	again, err := s.TryLead(ctx, store.ReconcilerLockID)
	require.NoError(t, err)
	require.NotNil(t, again)
	require.NoError(t, again.Check(ctx))
	again.Release(ctx)
}
