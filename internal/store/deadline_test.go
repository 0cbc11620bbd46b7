package store_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// A store call against a Postgres that stops answering fails at the
// store's deadline (context.DeadlineExceeded), and the store answers again
// once Postgres does.
func TestStoreCallsHaveADeadline(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testsvc.PostgresURL(t))
	require.NoError(t, err)
	proxy := testsvc.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	pool, err := pgxpool.New(context.Background(), u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := store.New(pool).WithTimeout(500 * time.Millisecond)
	ctx := context.Background()

	key := job.Key{Tenant: "acme", ID: "wedged"}
	mustInsert(t, s, sampleJob(key.Tenant, key.ID))

	proxy.Wedge(true)
	_, err = s.ClaimBatch(ctx, []job.Key{key}, "w1", time.Minute)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the call ends at its deadline: %v", err)
	_, err = s.Get(ctx, key)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	proxy.Wedge(false)
	require.Eventually(t, func() bool {
		rec, err := s.Get(ctx, key)
		return err == nil && rec.Status == job.StatusQueued
	}, 10*time.Second, 50*time.Millisecond, "the job is untouched and the store answers again")
}
