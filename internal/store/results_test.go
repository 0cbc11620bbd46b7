package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// outbox reads every result event of key, oldest first, without taking them.
func outbox(t testing.TB, pool *pgxpool.Pool, key job.Key) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT status FROM result_events
		WHERE tenant = $1 AND job_id = $2 ORDER BY seq`, key.Tenant, key.ID)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

func clearOutbox(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `DELETE FROM result_events`)
	require.NoError(t, err)
}

// TestEveryTerminalTransitionLeavesOneEvent runs every store method that
// moves a job, from every status it moves from: a move to a terminal status
// writes exactly one outbox event, in its own transaction, and any other
// move writes none. A trigger writes it for every statement that does not
// set finished_xid itself, so this holds for paths added later too; the
// completions, which set it, write their events in the same statement.
func TestEveryTerminalTransitionLeavesOneEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	for _, op := range transitionOps() {
		for _, from := range op.from {
			key := job.Key{Tenant: "acme", ID: sanitize(fmt.Sprintf("ev-%s-%s", op.name, from))}
			mustInsert(t, s, sampleJob(key.Tenant, key.ID))
			forceStatus(t, pool, key, from)
			clearOutboxOf(t, pool, key)
			require.NoError(t, op.run(ctx, s, key), "%s from %s", op.name, from)
			want := []string(nil)
			if op.target.Terminal() {
				want = []string{string(op.target)}
			}
			assert.Equal(t, want, outbox(t, pool, key), "%s from %s", op.name, from)
			rec := mustGet(t, s, key)
			var xid *string
			require.NoError(t, pool.QueryRow(ctx, `SELECT finished_xid::text FROM jobs WHERE tenant = $1 AND id = $2`,
				key.Tenant, key.ID).Scan(&xid))
			assert.Equal(t, rec.Status.Terminal(), xid != nil, "%s from %s: finished_xid set exactly while terminal", op.name, from)
		}
	}
}

func clearOutboxOf(t testing.TB, pool *pgxpool.Pool, key job.Key) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `DELETE FROM result_events WHERE tenant = $1 AND job_id = $2`, key.Tenant, key.ID)
	require.NoError(t, err)
}

// TestIntakeFailureLeavesOneEvent: a job refused at intake is failed from
// its first row, which is a terminal transition too; the same message again
// (ON CONFLICT DO NOTHING) adds no event.
func TestIntakeFailureLeavesOneEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	f := store.IntakeFailure{Tenant: "acme", ID: "bad-1", Model: "nope", Lane: job.PriorityNormal,
		Reason: "invalid job: model: unknown", Body: []byte(`{"id":"bad-1"}`),
		ReplyTo: "llmq.reply.acme.q1", CorrelationID: "c-1"}
	for range 2 {
		_, err := s.RecordIntakeFailure(ctx, f)
		require.NoError(t, err)
	}
	assert.Equal(t, []string{"failed"}, outbox(t, pool, job.Key{Tenant: "acme", ID: "bad-1"}))
	rec := mustGet(t, s, job.Key{Tenant: "acme", ID: "bad-1"})
	assert.Equal(t, "llmq.reply.acme.q1", rec.ReplyTo)
	assert.Equal(t, "c-1", rec.CorrelationID)
}

// TestRelayResults: events come out with the job as it finished (not its
// request), deliveries are stored and the events deleted with one commit;
// a failed publish keeps every event, with the same event id, for the next
// round.
func TestRelayResults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	clearOutbox(t, pool)
	j := sampleJob("acme", "r-1")
	j.ReplyTo, j.CorrelationID, j.CallbackURL = "llmq.reply.acme.q", "corr", "https://hooks.example.com/x"
	c := insertClaimed(t, s, j, "w1", 0)
	_, err := s.Complete(ctx, store.Attempt{Key: j.Key(), Owner: "w1", N: c.Record.Attempts}, result())
	require.NoError(t, err)

	var first []store.ResultEvent
	_, err = s.RelayResults(ctx, 10, everyEvent, func(evs []store.ResultEvent) ([]store.QueuedWebhook, error) {
		first = evs
		return nil, errors.New("broker down")
	})
	require.Error(t, err)
	require.Len(t, first, 1)
	ev := first[0]
	assert.Equal(t, job.StatusSucceeded, ev.Job.Status)
	assert.Equal(t, "qwen-plus", ev.Job.ModelUsed)
	assert.JSONEq(t, `{"ticket": 4711}`, string(ev.Job.Metadata))
	assert.Equal(t, "llmq.reply.acme.q", ev.Job.ReplyTo)
	assert.Equal(t, "corr", ev.Job.CorrelationID)
	assert.Equal(t, 10, ev.Job.PromptTokens)
	assert.Nil(t, ev.Job.Request, "the outbox never holds the request")
	require.NotNil(t, ev.Job.CompletedAt)
	assert.Equal(t, ev.Job.CompletedAt.UnixMicro(), ev.OccurredAt.UnixMicro())

	n, err := s.RelayResults(ctx, 10, everyEvent, func(evs []store.ResultEvent) ([]store.QueuedWebhook, error) {
		require.Len(t, evs, 1)
		assert.Equal(t, ev.EventID, evs[0].EventID, "a repeat carries the same event id")
		d := store.QueuedWebhook{EventID: ev.EventID, Tenant: "acme", JobID: "r-1", URL: j.CallbackURL, Payload: []byte(`{}`)}
		return []store.QueuedWebhook{d, d}, nil
	})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Empty(t, outbox(t, pool, j.Key()))
	var hooks int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE job_id = 'r-1' AND status = 'pending'`).Scan(&hooks))
	assert.Equal(t, 1, hooks)
	pending, _, err := s.PendingResults(ctx)
	require.NoError(t, err)
	assert.Zero(t, pending)
}

func everyEvent(store.ResultEvent) bool { return true }

// TestRelayResultsOnlyWhatIsHeard: wants sees each event's routing fields
// (not the finished job's response); an event it refuses is not handed to
// publish, yet leaves the outbox with the others in the same commit.
func TestRelayResultsOnlyWhatIsHeard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	clearOutbox(t, pool)
	heard, quiet := sampleJob("acme", "heard"), sampleJob("acme", "quiet")
	heard.ReplyTo, heard.CorrelationID = "llmq.reply.acme.q", "corr"
	for _, j := range []job.Job{heard, quiet} {
		c := insertClaimed(t, s, j, "w1", 0)
		_, err := s.Complete(ctx, store.Attempt{Key: j.Key(), Owner: "w1", N: c.Record.Attempts}, result())
		require.NoError(t, err)
	}
	var seen []store.ResultEvent
	n, err := s.RelayResults(ctx, 10, func(e store.ResultEvent) bool {
		seen = append(seen, e)
		return e.Job.ReplyTo != ""
	}, func(evs []store.ResultEvent) ([]store.QueuedWebhook, error) {
		require.Len(t, evs, 1)
		ev := evs[0]
		assert.Equal(t, "heard", ev.Job.ID)
		assert.Equal(t, job.StatusSucceeded, ev.Job.Status)
		assert.Equal(t, "qwen-plus", ev.Job.ModelUsed, "a heard event carries the finished job")
		assert.NotNil(t, ev.Job.Response)
		assert.JSONEq(t, `{"ticket": 4711}`, string(ev.Job.Metadata))
		assert.Nil(t, ev.Job.Request, "the outbox never holds the request")
		require.NotNil(t, ev.Job.CompletedAt)
		assert.Equal(t, ev.OccurredAt.UnixMicro(), ev.Job.CompletedAt.UnixMicro())
		return nil, nil
	})
	require.NoError(t, err)
	assert.Equal(t, 2, n, "both events are relayed")
	require.Len(t, seen, 2)
	for _, e := range seen {
		assert.Equal(t, "acme", e.Job.Tenant)
		assert.Equal(t, job.StatusSucceeded, e.Job.Status)
		assert.Equal(t, job.PriorityNormal, e.Job.Priority)
		require.NotNil(t, e.Job.CompletedAt)
		assert.Equal(t, e.OccurredAt, *e.Job.CompletedAt)
		assert.Nil(t, e.Job.Response, "wants sees the routing fields only")
	}
	assert.False(t, seen[0].OccurredAt.IsZero())
	assert.Empty(t, outbox(t, pool, heard.Key()))
	assert.Empty(t, outbox(t, pool, quiet.Key()))
}

// An event whose job row is gone is dropped, not left in the outbox for
// ever; the others stay.
func TestDropOrphanResults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	for _, id := range []string{"kept", "gone"} {
		mustInsert(t, s, sampleJob("acme", id))
		_, err := s.Cancel(ctx, job.Key{Tenant: "acme", ID: id})
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `DELETE FROM jobs WHERE id = 'gone'`)
	require.NoError(t, err)
	n, err := s.DropOrphanResults(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	assert.Equal(t, []string{"cancelled"}, outbox(t, pool, job.Key{Tenant: "acme", ID: "kept"}))
}
