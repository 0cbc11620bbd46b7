package store_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// A job whose values Postgres refuses fails its whole batch, and trying
// the batch again fails it again: UnstorableJobs names the job, and
// writes nothing.
func TestUnstorableJobsNamesTheJobPostgresRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testsvc.PostgresSmallStack(t)
	s := store.New(pool)

	deep := sampleJob("acme", "deep")
	deep.Metadata = json.RawMessage(`{"tree":` + testsvc.DeepJSON(testsvc.SmallStackDepth) + `}`)
	jobs := []job.Job{sampleJob("acme", "a"), deep, sampleJob("acme", "b")}

	_, err := s.InsertBatch(ctx, jobs)
	require.Error(t, err)
	require.True(t, store.Unstorable(err), "refused for its values: %v", err)
	assert.Contains(t, store.UnstorableReason("this job", err), "stack depth limit exceeded (SQLSTATE 54001)")

	errs, err := s.UnstorableJobs(ctx, jobs)
	require.NoError(t, err)
	require.Len(t, errs, 3)
	assert.NoError(t, errs[0])
	assert.True(t, store.Unstorable(errs[1]), "the deep job: %v", errs[1])
	assert.NoError(t, errs[2])
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs`).Scan(&n))
	assert.Zero(t, n, "the probe writes nothing")

	res, err := s.InsertBatch(ctx, []job.Job{jobs[0], jobs[2]})
	require.NoError(t, err, "the batch without it is stored")
	assert.True(t, res[0].Created && res[1].Created)
}

func TestUnstorableIsAboutValuesNotTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := newStore(t)
	for _, c := range []struct {
		sql  string
		want bool
	}{
		{`SELECT '{"a": 1e999999}'::jsonb`, true},       // 22003 numeric out of range
		{`SELECT E'"\\ud800"'::jsonb`, true},            // 22P05 untranslatable
		{`SELECT 1/0`, true},                            // 22012
		{`SELECT * FROM no_such_table`, false},          // 42P01
		{`SELECT pg_terminate_backend(-1)::int`, false}, // no error at all
	} {
		_, err := pool.Exec(ctx, c.sql)
		assert.Equal(t, c.want, store.Unstorable(err), "%s: %v", c.sql, err)
	}
	assert.False(t, store.Unstorable(context.DeadlineExceeded))
	assert.False(t, store.Unstorable(nil))
}
