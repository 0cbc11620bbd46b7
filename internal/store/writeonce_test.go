package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// A job written once, finished, is the row a claimed insert and its
// completion leave: same columns of the job and result, the outbox row and
// the usage; a second write of the key stores nothing.
func TestInsertFinishedStoresWhatClaimAndCompleteStore(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	res := store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{"choices": [{"message": {"content": "ok"}}]}`),
		PromptTokens: 11, CompletionTokens: 7, Trace: store.Trace{HTTPStatus: 200}}

	twice := sampleJob("acme", "two-writes")
	twice.ReplyTo, twice.CorrelationID = "amq.rabbitmq.reply-to", "c-1"
	got, err := s.InsertClaiming(ctx, []job.Job{twice}, store.Claiming{Claim: []bool{true}, Owner: "w1", Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, got[0].Claimed)
	ok, err := s.CompleteBatch(ctx, []store.Completion{{Attempt: store.Attempt{Key: twice.Key(), Owner: "w1", N: 1}, Result: res}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)

	once := twice
	once.ID = "one-write"
	readAt := time.Now().Add(-time.Second).UTC().Truncate(time.Microsecond)
	ok, err = s.InsertFinished(ctx, []store.Finished{{Job: once, Owner: "w1", ReadAt: readAt, Result: res}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)

	a, b := mustGet(t, s, twice.Key()), mustGet(t, s, once.Key())
	assert.Equal(t, job.StatusSucceeded, b.Status)
	assert.Equal(t, readAt, b.CreatedAt)
	require.NotNil(t, b.StartedAt)
	assert.Equal(t, readAt, *b.StartedAt)
	for _, r := range []*store.Record{&a, &b} {
		r.ID, r.CreatedAt, r.UpdatedAt, r.StartedAt, r.CompletedAt = "", time.Time{}, time.Time{}, nil, nil
	}
	assert.Equal(t, a.Job, b.Job, "the job's columns")
	assert.Equal(t, a.Attempts, b.Attempts)
	assert.Equal(t, a.ModelUsed, b.ModelUsed)
	assert.JSONEq(t, string(a.Response), string(b.Response))
	assert.Equal(t, a.PromptTokens, b.PromptTokens)
	assert.Equal(t, a.CompletionTokens, b.CompletionTokens)
	assert.Equal(t, a.LeaseOwner, b.LeaseOwner)

	var events, withXid, logged int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM result_events WHERE tenant = 'acme' AND status = 'succeeded'`).Scan(&events))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE finished_xid IS NOT NULL`).Scan(&withXid))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE jsonb_array_length(attempt_log) = 1 AND attempt_log->0->>'outcome' = 'succeeded'`).Scan(&logged))
	assert.Equal(t, 2, events, "one outbox row each")
	assert.Equal(t, 2, withXid)
	assert.Equal(t, 2, logged, "one attempt logged each")
	var calls, in, out int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(calls), sum(input_tokens), sum(output_tokens) FROM usage_hours WHERE tenant = 'acme'`).Scan(&calls, &in, &out))
	assert.Equal(t, []int64{2, 22, 14}, []int64{calls, in, out}, "both calls in usage")

	again := res
	again.Response = json.RawMessage(`{"other": true}`)
	ok, err = s.InsertFinished(ctx, []store.Finished{{Job: once, Owner: "w2", ReadAt: time.Now(), Result: again}})
	require.NoError(t, err)
	assert.Equal(t, []bool{false}, ok, "the key is taken")
	assert.JSONEq(t, string(res.Response), string(mustGet(t, s, once.Key()).Response), "the stored result stands")
}

// Absent answers true only for a job an insert would create unparked.
func TestAbsentFindsRowsTombstonesAndParkedGroups(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	stored := sampleJob("acme", "stored")
	mustInsert(t, s, stored)
	_, err := pool.Exec(ctx, `INSERT INTO job_tombstones (tenant, id, status, kind, hash, created_at, completed_at, deleted_at)
		VALUES ('acme', 'deleted', 'succeeded', 'chat', '', now(), now(), now())`)
	require.NoError(t, err)
	parked := sampleJob("beta", "parked")
	mustInsert(t, s, parked)
	got, err := s.Park(ctx, []job.Key{parked.Key()})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, got)

	fresh, deleted, behind, other := sampleJob("acme", "fresh"), sampleJob("acme", "deleted"), sampleJob("beta", "behind"), sampleJob("beta", "other-lane")
	other.Priority = job.PriorityHigh
	absent, err := s.Absent(ctx, []job.Job{fresh, stored, deleted, behind, other})
	require.NoError(t, err)
	assert.Equal(t, []bool{true, false, false, false, true}, absent,
		"fresh, stored, tombstoned, behind its group's parked job, another lane of that tenant")
}

// A job that runs already (write-once) is stored claimed even where its
// group has parked jobs; without Running it is parked behind them.
func TestInsertClaimingRunningIsNotParked(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	parked := sampleJob("acme", "parked")
	_, err := s.InsertClaiming(ctx, []job.Job{parked}, store.Claiming{Park: []bool{true}})
	require.NoError(t, err)

	claim := store.Claiming{Claim: []bool{true}, Owner: "w1", Lease: time.Minute}
	got, err := s.InsertClaiming(ctx, []job.Job{sampleJob("acme", "behind")}, claim)
	require.NoError(t, err)
	assert.True(t, got[0].Parked, "a job not yet running parks behind its group")

	claim.Running = true
	got, err = s.InsertClaiming(ctx, []job.Job{sampleJob("acme", "running")}, claim)
	require.NoError(t, err)
	assert.True(t, got[0].Claimed)
	assert.False(t, got[0].Parked)
	assert.Equal(t, job.StatusRunning, mustGet(t, s, job.Key{Tenant: "acme", ID: "running"}).Status)
}
