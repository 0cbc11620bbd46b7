package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
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
	deeper := sampleJob("acme", "deeper")
	deeper.Request = json.RawMessage(`{"messages": [], "x": ` + testsvc.DeepJSON(testsvc.SmallStackDepth) + `}`)
	jobs := []job.Job{sampleJob("acme", "a"), deep, sampleJob("acme", "b"), sampleJob("acme", "c"), sampleJob("acme", "d"),
		deeper, sampleJob("acme", "e")}

	_, err := s.InsertBatch(ctx, jobs)
	require.Error(t, err)
	require.True(t, store.Unstorable(err), "refused for its values: %v", err)
	assert.Contains(t, store.UnstorableReason("this job", err), "stack depth limit exceeded (SQLSTATE 54001)")

	errs, err := s.UnstorableJobs(ctx, jobs)
	require.NoError(t, err)
	require.Len(t, errs, len(jobs))
	var kept []job.Job
	for i, e := range errs {
		if i == 1 || i == 5 {
			assert.True(t, store.Unstorable(e), "job %s: %v", jobs[i].ID, e)
		} else {
			assert.NoError(t, e, jobs[i].ID)
			kept = append(kept, jobs[i])
		}
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs`).Scan(&n))
	assert.Zero(t, n, "the probe writes nothing")

	res, err := s.InsertBatch(ctx, kept)
	require.NoError(t, err, "the batch without them is stored")
	for _, r := range res {
		assert.True(t, r.Created)
	}
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

// BenchmarkUnstorableJobs measures what a batch Postgres refuses for one
// job costs to sort out: the probe of a batch of 128 ~1 KB jobs, one of
// them refused. Run with
//
//	LLMQ_TEST_POSTGRES_URL=… go test -run '^$' -bench UnstorableJobs ./internal/store/
func BenchmarkUnstorableJobs(b *testing.B) {
	ctx := context.Background()
	s := store.New(testsvc.PostgresSmallStack(b))
	jobs := make([]job.Job, 128)
	for i := range jobs {
		jobs[i] = sampleJob("acme", fmt.Sprintf("j-%d", i))
		jobs[i].Request = json.RawMessage(fmt.Sprintf(`{"messages": [{"role": "user", "content": %q}]}`, strings.Repeat("x", 1000)))
	}
	jobs[64].Metadata = json.RawMessage(`{"tree":` + testsvc.DeepJSON(testsvc.SmallStackDepth) + `}`)
	b.ResetTimer()
	for range b.N {
		errs, err := s.UnstorableJobs(ctx, jobs)
		if err != nil || errs[64] == nil {
			b.Fatalf("probe: %v, job 64: %v", err, errs[64])
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(jobs)), "µs/job")
}
