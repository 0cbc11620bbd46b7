package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// newStore returns a store on a fresh migrated database and a pool on the
// same database for raw SQL.
func newStore(t testing.TB) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	pool := testsvc.Postgres(t)
	return store.New(pool), pool
}

// explain returns the plan Postgres picks for sql with args, one line per
// row of EXPLAIN, through q (a pool, or a transaction with planner
// settings of its own).
func explain(t testing.TB, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, sql string, args ...any) string {
	t.Helper()
	rows, err := q.Query(context.Background(), "EXPLAIN "+sql, args...)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(plan, "\n")
}

func sampleJob(tenant, id string) job.Job {
	return job.Job{
		ID: id, Tenant: tenant, Model: "qwen-plus", FallbackModels: []string{"qwen-flash"},
		Priority: job.PriorityNormal,
		Request:  json.RawMessage(`{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}`),
		Metadata: json.RawMessage(`{"ticket": 4711}`), MaxAttempts: 3,
	}
}

func mustInsert(t testing.TB, s *store.Store, j job.Job) store.Record {
	t.Helper()
	rec, created, err := s.Insert(context.Background(), j)
	require.NoError(t, err)
	require.True(t, created, "job %s already existed", j.ID)
	return rec
}

func mustGet(t testing.TB, s *store.Store, key job.Key) store.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), key)
	require.NoError(t, err)
	return rec
}

// forceStatus writes a row consistent with status by raw SQL, bypassing the
// store: running holds lease "w1" (live) at attempt 1, retrying is due.
func forceStatus(t testing.TB, pool *pgxpool.Pool, key job.Key, status job.Status) {
	t.Helper()
	cols := map[string]string{
		"attempts": "1", "lease_owner": "NULL", "lease_expires_at": "NULL", "started_at": "now()",
		"completed_at": "NULL", "next_attempt_at": "NULL", "model_used": "NULL", "response": "NULL", "batched_at": "NULL",
	}
	switch status {
	case job.StatusQueued:
		cols["attempts"], cols["started_at"] = "0", "NULL"
	case job.StatusRunning:
		cols["lease_owner"], cols["lease_expires_at"] = "'w1'", "now() + interval '1 hour'"
	case job.StatusRetrying:
		cols["next_attempt_at"] = "now() - interval '1 second'"
	case job.StatusBatched:
		cols["batched_at"], cols["batch_id"] = "now()", "0"
	case job.StatusSucceeded:
		cols["completed_at"], cols["model_used"], cols["response"] = "now()", "'qwen-plus'", `'{"ok": true}'`
	case job.StatusFailed, job.StatusDead, job.StatusCancelled:
		cols["completed_at"] = "now()"
	}
	set := fmt.Sprintf("status = '%s'", status)
	for c, v := range cols {
		set += ", " + c + " = " + v
	}
	_, err := pool.Exec(context.Background(), `UPDATE jobs SET `+set+` WHERE tenant = $1 AND id = $2`, key.Tenant, key.ID)
	require.NoError(t, err, "force %s", status)
}

// expireLease moves a running job's lease into the past.
func expireLease(t testing.TB, pool *pgxpool.Pool, key job.Key) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `UPDATE jobs SET lease_expires_at = now() - interval '1 second'
		WHERE tenant = $1 AND id = $2`, key.Tenant, key.ID)
	require.NoError(t, err)
}

func result() store.Result {
	return store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{"choices": []}`), PromptTokens: 10, CompletionTokens: 5}
}

func attemptErr(kind string) store.AttemptError {
	return store.AttemptError{Model: "qwen-plus", Kind: kind, Code: "x", Message: kind + " happened", At: time.Now()}
}

// insertClaimed stores j (it must be new) and claims it by key for owner:
// the path of every job now, written first and claimed through its key.
func insertClaimed(t testing.TB, s *store.Store, j job.Job, owner string, lease time.Duration) store.Claim {
	t.Helper()
	mustInsert(t, s, j)
	c, err := s.Claim(context.Background(), j.Key(), owner, lease)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome, "claim %s", j.ID)
	return c
}

// deadLetters lists every dead letter of tenant, oldest first.
func deadLetters(t testing.TB, s *store.Store, tenant string) []store.DeadLetterRow {
	t.Helper()
	var all []store.DeadLetterRow
	cursor := ""
	for {
		page, next, err := s.ListDeadLetters(context.Background(), tenant, cursor, store.MaxListLimit)
		require.NoError(t, err)
		all = append(all, page...)
		if next == "" {
			return all
		}
		cursor = next
	}
}
