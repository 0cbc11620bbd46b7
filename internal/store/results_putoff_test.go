package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// An event the broker refused on its own is put off, with a backoff, and
// the others of its round are done: a later round does not take it before
// it is due, so it holds nothing back.
func TestRelayResultsPutsOffWhatTheBrokerRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	clearOutbox(t, pool)
	for _, id := range []string{"p-1", "p-2", "p-3"} {
		j := sampleJob("acme", id)
		c := insertClaimed(t, s, j, "w1", 0)
		_, err := s.Complete(ctx, store.Attempt{Key: j.Key(), Owner: "w1", N: c.Record.Attempts}, result())
		require.NoError(t, err)
	}
	n, err := s.RelayResults(ctx, 10, everyEvent, func(evs []store.ResultEvent) ([]store.QueuedWebhook, error) {
		require.Len(t, evs, 3)
		var refused int
		for i, e := range evs {
			if e.Job.ID == "p-2" {
				refused = i
			}
		}
		return nil, &store.PutOff{Events: []int{refused}}
	})
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the two others are done")
	var attempts int
	var due time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT attempts, next_attempt_at FROM result_events WHERE job_id = 'p-2'`).Scan(&attempts, &due))
	assert.Equal(t, 1, attempts)
	assert.WithinDuration(t, time.Now().Add(time.Second), due, 900*time.Millisecond)

	has, err := s.HasResultEvents(ctx)
	require.NoError(t, err)
	assert.False(t, has, "nothing is due")
	n, err = s.RelayResults(ctx, 10, everyEvent, func(evs []store.ResultEvent) ([]store.QueuedWebhook, error) {
		t.Errorf("handed out %d events before they were due", len(evs))
		return nil, nil
	})
	require.NoError(t, err)
	assert.Zero(t, n)

	_, err = pool.Exec(ctx, `UPDATE result_events SET next_attempt_at = now() - interval '1 second'`)
	require.NoError(t, err)
	n, err = s.RelayResults(ctx, 10, everyEvent, func(evs []store.ResultEvent) ([]store.QueuedWebhook, error) {
		require.Len(t, evs, 1)
		assert.Equal(t, "p-2", evs[0].Job.ID)
		return nil, nil
	})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "relayed once due")
}

// A round the broker failed as a whole keeps its events, and still tells
// the long-polls of their jobs that they finished.
func TestRelayResultsNotifiesWhenTheBrokerFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	conn, err := pgx.Connect(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN "+store.FinishedChannel)
	require.NoError(t, err)

	j := sampleJob("acme", "n-1")
	c := insertClaimed(t, s, j, "w1", 0)
	_, err = s.Complete(ctx, store.Attempt{Key: j.Key(), Owner: "w1", N: c.Record.Attempts}, result())
	require.NoError(t, err)
	_, err = s.RelayResults(ctx, 10, everyEvent, func([]store.ResultEvent) ([]store.QueuedWebhook, error) {
		return nil, errors.New("broker down")
	})
	require.Error(t, err)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	require.NoError(t, err, "notified")
	assert.Equal(t, string(job.PriorityNormal)+" acme n-1", n.Payload)
	has, err := s.HasResultEvents(ctx)
	require.NoError(t, err)
	assert.True(t, has, "the event stays for the next round")
}

// A publish slower than the store's timeout (a broker slow to confirm a
// large round) does not roll the round back: the timeout bounds the reads
// and the writes around it, not it.
func TestRelayResultsOutlastsASlowPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	s = s.WithTimeout(300 * time.Millisecond)
	clearOutbox(t, pool)
	j := sampleJob("acme", "slow-1")
	c := insertClaimed(t, s, j, "w1", 0)
	_, err := s.Complete(ctx, store.Attempt{Key: j.Key(), Owner: "w1", N: c.Record.Attempts}, result())
	require.NoError(t, err)
	n, err := s.RelayResults(ctx, 10, everyEvent, func([]store.ResultEvent) ([]store.QueuedWebhook, error) {
		time.Sleep(time.Second)
		return nil, nil
	})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

// A replay drops the job's events the relay put off: sent after the
// replay's own finish, such an event would tell its old status last. A
// replay that does not move the job drops nothing.
func TestReplayDropsThePutOffEventsOfTheJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	clearOutbox(t, pool)
	dead, done := job.Key{Tenant: "acme", ID: "r-dead"}, job.Key{Tenant: "acme", ID: "r-done"}
	mustInsert(t, s, sampleJob(dead.Tenant, dead.ID))
	mustInsert(t, s, sampleJob(done.Tenant, done.ID))
	finish(t, pool, dead, job.StatusDead)
	finish(t, pool, done, job.StatusSucceeded)
	_, err := pool.Exec(ctx, `INSERT INTO result_events (tenant, job_id, status, occurred_at, attempts, next_attempt_at)
		VALUES ('acme', 'r-dead', 'dead', now(), 3, now() + interval '1 minute'),
		       ('acme', 'r-done', 'succeeded', now(), 3, now() + interval '1 minute')`)
	require.NoError(t, err)
	count := func(id string) (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM result_events WHERE job_id = $1 AND attempts > 0`, id).Scan(&n))
		return n
	}

	_, err = s.Replay(ctx, done)
	var te *job.TransitionError
	require.ErrorAs(t, err, &te, "a succeeded job is not replayed")
	assert.Equal(t, 1, count("r-done"), "nor its event dropped")

	_, err = s.Replay(ctx, dead)
	require.NoError(t, err)
	assert.Zero(t, count("r-dead"), "the put-off dead event is dropped")
}
