package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// waitFor bounds every wait on a condition that time makes true (a retry
// falling due, a lease expiring): the condition is polled, never slept on.
const waitFor = 10 * time.Second

// setEnqueuedAt writes enqueued_at by raw SQL: now() when set, else NULL.
func setEnqueuedAt(t testing.TB, pool *pgxpool.Pool, key job.Key, set bool) {
	t.Helper()
	v := "NULL"
	if set {
		v = "now()"
	}
	_, err := pool.Exec(context.Background(), `UPDATE jobs SET enqueued_at = `+v+` WHERE tenant = $1 AND id = $2`, key.Tenant, key.ID)
	require.NoError(t, err)
}

func keysOf(recs []store.Record) []job.Key {
	out := make([]job.Key, len(recs))
	for i, r := range recs {
		out[i] = r.Key()
	}
	return out
}

// MarkEnqueued sets enqueued_at of unfinished jobs only; MarkUnenqueued
// clears it of queued and retrying jobs only.
func TestMarkEnqueuedAndUnenqueuedByStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	for _, st := range job.Statuses {
		t.Run(string(st), func(t *testing.T) {
			key := job.Key{Tenant: "acme", ID: "mark-" + string(st)}
			mustInsert(t, s, sampleJob(key.Tenant, key.ID))
			forceStatus(t, pool, key, st)

			setEnqueuedAt(t, pool, key, false)
			require.NoError(t, s.MarkEnqueued(ctx, []job.Key{key, {Tenant: "acme", ID: "missing"}}))
			unfinished := st == job.StatusQueued || st == job.StatusRunning || st == job.StatusRetrying
			assert.Equal(t, unfinished, mustGet(t, s, key).EnqueuedAt != nil, "MarkEnqueued on %s", st)

			setEnqueuedAt(t, pool, key, true)
			before := mustGet(t, s, key)
			require.NoError(t, s.MarkUnenqueued(ctx, key))
			after := mustGet(t, s, key)
			if st == job.StatusQueued || st == job.StatusRetrying {
				assert.Nil(t, after.EnqueuedAt, "MarkUnenqueued on %s", st)
				after.EnqueuedAt = before.EnqueuedAt
			}
			assert.Equal(t, before, after, "MarkUnenqueued changes nothing else on %s", st)
		})
	}
	require.NoError(t, s.MarkEnqueued(ctx, nil))
	require.NoError(t, s.MarkUnenqueued(ctx, job.Key{Tenant: "acme", ID: "missing"}))
}

// The enqueued_at lifecycle of a job: set by its insert, cleared when its
// publish fails, untouched by a claim, set by every scheduled retry (its
// delayed message is published right after), cleared again by a replay.
func TestEnqueuedAtLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	for _, tc := range []struct {
		name     string
		schedule func(a store.Attempt) (bool, error)
	}{
		{"ScheduleRetry", func(a store.Attempt) (bool, error) {
			return s.ScheduleRetry(ctx, a, time.Now().Add(time.Hour), attemptErr("server_error"))
		}},
		{"DeferRateLimited", func(a store.Attempt) (bool, error) {
			return s.DeferRateLimited(ctx, a, time.Now().Add(time.Hour), attemptErr("rate_limit"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := mustInsert(t, s, sampleJob("acme", tc.name))
			require.NotNil(t, rec.EnqueuedAt, "Insert sets enqueued_at")
			key := rec.Key()
			require.NoError(t, s.MarkUnenqueued(ctx, key))
			require.Nil(t, mustGet(t, s, key).EnqueuedAt)

			c, err := s.Claim(ctx, key, "w1", time.Minute)
			require.NoError(t, err)
			require.Equal(t, store.Claimed, c.Outcome)
			assert.Nil(t, c.Record.EnqueuedAt, "a claim does not publish")

			ok, err := tc.schedule(c.AttemptOf("w1"))
			require.NoError(t, err)
			require.True(t, ok)
			retrying := mustGet(t, s, key)
			assert.Equal(t, job.StatusRetrying, retrying.Status)
			require.NotNil(t, retrying.EnqueuedAt, "%s sets enqueued_at", tc.name)
			assert.Equal(t, retrying.UpdatedAt, *retrying.EnqueuedAt, "set by the same statement")

			require.NoError(t, s.MarkUnenqueued(ctx, key))
			assert.Nil(t, mustGet(t, s, key).EnqueuedAt, "a failed publish of the retry clears it")

			// Refused (the claim no longer holds): enqueued_at stays as it is.
			ok, err = tc.schedule(c.AttemptOf("w1"))
			require.NoError(t, err)
			assert.False(t, ok)
			assert.Nil(t, mustGet(t, s, key).EnqueuedAt)
		})
	}
}

// Unenqueued finds the jobs that need a message now: queued with none at
// once, retrying with none only once due.
func TestUnenqueued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	retrying := func(id string, at time.Time, unenqueue bool) job.Key {
		c := insertClaimed(t, s, sampleJob("acme", id), "w1", time.Minute)
		ok, err := s.ScheduleRetry(ctx, c.AttemptOf("w1"), at, attemptErr("server_error"))
		require.NoError(t, err)
		require.True(t, ok)
		if unenqueue {
			require.NoError(t, s.MarkUnenqueued(ctx, c.Record.Key()))
		}
		return c.Record.Key()
	}
	queuedNull := insertKey(t, s, sampleJob("acme", "queued-null"))
	require.NoError(t, s.MarkUnenqueued(ctx, queuedNull))
	queuedNull2 := insertKey(t, s, sampleJob("acme", "queued-null-2"))
	require.NoError(t, s.MarkUnenqueued(ctx, queuedNull2))
	mustInsert(t, s, sampleJob("acme", "queued-enqueued"))
	retryingLater := retrying("retrying-null-later", time.Now().Add(time.Hour), true)
	retryingSoon := retrying("retrying-null-soon", time.Now().Add(50*time.Millisecond), true)
	retrying("retrying-enqueued-soon", time.Now().Add(50*time.Millisecond), false)
	running := job.Key{Tenant: "acme", ID: "running-null"}
	insertClaimed(t, s, sampleJob(running.Tenant, running.ID), "w1", time.Minute)
	setEnqueuedAt(t, pool, running, false)
	done := insertKey(t, s, sampleJob("acme", "succeeded-null"))
	forceStatus(t, pool, done, job.StatusSucceeded)
	setEnqueuedAt(t, pool, done, false)

	recs, err := s.Unenqueued(ctx, 100)
	require.NoError(t, err)
	got := keysOf(recs)
	require.Subset(t, got, []job.Key{queuedNull, queuedNull2}, "a queued job without a message is found at once")
	assert.NotContains(t, got, retryingLater, "a retry that is not due needs no message yet")
	assert.Equal(t, []job.Key{queuedNull, queuedNull2}, got[:2], "oldest first")

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		recs, err := s.Unenqueued(ctx, 100)
		require.NoError(c, err)
		assert.Contains(c, keysOf(recs), retryingSoon)
	}, waitFor, 10*time.Millisecond, "a due retry without a message is found")
	recs, err = s.Unenqueued(ctx, 100)
	require.NoError(t, err)
	assert.ElementsMatch(t, []job.Key{queuedNull, queuedNull2, retryingSoon}, keysOf(recs),
		"a job with a message, a retry not due, a running and a finished job are never found")
	for _, r := range recs {
		assert.Nil(t, r.EnqueuedAt, r.ID)
	}

	recs, err = s.Unenqueued(ctx, 1)
	require.NoError(t, err)
	assert.Len(t, recs, 1, "limit")
}

// Stale finds, per lane, the unfinished jobs whose message should have been
// consumed more than `after` ago.
func TestStale(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	const (
		lane  = job.PriorityLow
		after = 20 * time.Millisecond
	)
	claim := func(t *testing.T, j job.Job, lease time.Duration) store.Claim {
		return insertClaimed(t, s, j, "w1", lease)
	}
	retry := func(t *testing.T, j job.Job, at time.Time) {
		c := claim(t, j, time.Minute)
		ok, err := s.ScheduleRetry(ctx, c.AttemptOf("w1"), at, attemptErr("server_error"))
		require.NoError(t, err)
		require.True(t, ok)
	}
	cases := []struct {
		id      string
		prepare func(t *testing.T, j job.Job)
		stale   bool
	}{
		{"queued", func(t *testing.T, j job.Job) { mustInsert(t, s, j) }, true},
		{"queued-unenqueued", func(t *testing.T, j job.Job) {
			// No message at all: Unenqueued's business, not Stale's.
			mustInsert(t, s, j)
			require.NoError(t, s.MarkUnenqueued(ctx, j.Key()))
		}, false},
		{"retrying-due", func(t *testing.T, j job.Job) { retry(t, j, time.Now()) }, true},
		{"retrying-due-unenqueued", func(t *testing.T, j job.Job) {
			retry(t, j, time.Now())
			require.NoError(t, s.MarkUnenqueued(ctx, j.Key()))
		}, false},
		{"retrying-later", func(t *testing.T, j job.Job) { retry(t, j, time.Now().Add(time.Hour)) }, false},
		{"running-expired", func(t *testing.T, j job.Job) { claim(t, j, 10*time.Millisecond) }, true},
		{"running-live", func(t *testing.T, j job.Job) { claim(t, j, time.Hour) }, false},
		{"succeeded", func(t *testing.T, j job.Job) {
			mustInsert(t, s, j)
			forceStatus(t, pool, j.Key(), job.StatusSucceeded)
		}, false},
		{"failed", func(t *testing.T, j job.Job) {
			mustInsert(t, s, j)
			forceStatus(t, pool, j.Key(), job.StatusFailed)
		}, false},
		{"cancelled", func(t *testing.T, j job.Job) {
			mustInsert(t, s, j)
			_, err := s.Cancel(ctx, j.Key())
			require.NoError(t, err)
		}, false},
		{"other-lane-queued", func(t *testing.T, j job.Job) {
			j.Priority = job.PriorityHigh
			mustInsert(t, s, j)
		}, false},
	}
	var want []job.Key
	for _, c := range cases {
		j := sampleJob("acme", c.id)
		j.Priority = lane
		c.prepare(t, j)
		if c.stale {
			want = append(want, j.Key())
		}
	}

	recs, err := s.Stale(ctx, lane, time.Hour, 100)
	require.NoError(t, err)
	assert.Empty(t, recs, "nothing is stale for an hour")

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		recs, err := s.Stale(ctx, lane, after, 100)
		require.NoError(c, err)
		assert.Subset(c, keysOf(recs), want)
	}, waitFor, 10*time.Millisecond, "stale jobs appear once `after` has passed")
	recs, err = s.Stale(ctx, lane, after, 100)
	require.NoError(t, err)
	assert.Equal(t, want, keysOf(recs), "exactly the stale jobs, oldest first")

	recs, err = s.Stale(ctx, lane, after, 2)
	require.NoError(t, err)
	assert.Equal(t, want[:2], keysOf(recs), "limit")

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		recs, err := s.Stale(ctx, job.PriorityHigh, after, 100)
		require.NoError(c, err)
		require.Len(c, recs, 1)
		assert.Equal(c, "other-lane-queued", recs[0].ID, "the other lane has its own")
	}, waitFor, 10*time.Millisecond)
}

func TestUnconfigured(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	add := func(id, model string, status job.Status) job.Key {
		j := sampleJob("acme", id)
		j.Model = model
		mustInsert(t, s, j)
		if status != job.StatusQueued {
			forceStatus(t, pool, j.Key(), status)
		}
		return j.Key()
	}
	add("served", "qwen-plus", job.StatusQueued)
	gone1 := add("gone-1", "removed-model", job.StatusQueued)
	gone2 := add("gone-2", "other-removed", job.StatusQueued)
	add("gone-running", "removed-model", job.StatusRunning)
	add("gone-retrying", "removed-model", job.StatusRetrying)
	add("gone-succeeded", "removed-model", job.StatusSucceeded)

	for _, tc := range []struct {
		name   string
		models []string
		limit  int
		want   []job.Key
	}{
		{"one removed model", []string{"qwen-plus", "other-removed"}, 100, []job.Key{gone1}},
		{"both removed", []string{"qwen-plus"}, 100, []job.Key{gone1, gone2}},
		{"limit, oldest first", []string{"qwen-plus"}, 1, []job.Key{gone1}},
		{"no model configured", []string{}, 100, []job.Key{{Tenant: "acme", ID: "served"}, gone1, gone2}},
		{"every model configured", []string{"qwen-plus", "removed-model", "other-removed"}, 100, nil},
	} {
		recs, err := s.Unconfigured(ctx, tc.models, tc.limit)
		require.NoError(t, err, tc.name)
		got := keysOf(recs)
		if len(tc.want) == 0 {
			assert.Empty(t, got, tc.name)
			continue
		}
		assert.Equal(t, tc.want, got, tc.name)
	}
}

func TestFailQueued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	key := insertKey(t, s, sampleJob("acme", "unserved"))
	dl := deadLetterOf(key)
	dl.Kind = store.DeadLetterMessage // FailQueued records the job's own dead letter whatever is passed
	dl.Reason = "model removed from the config"
	e := store.AttemptError{Kind: "model_unconfigured", Model: "qwen-plus", Message: "no such model"}
	ok, err := s.FailQueued(ctx, key, e, dl)
	require.NoError(t, err)
	require.True(t, ok)

	rec := mustGet(t, s, key)
	assert.Equal(t, job.StatusFailed, rec.Status)
	require.NotNil(t, rec.CompletedAt)
	require.Len(t, rec.Errors, 1)
	assert.Equal(t, "model_unconfigured", rec.Errors[0].Kind)
	assert.Equal(t, "no such model", rec.Errors[0].Message)
	dls := deadLetters(t, s, "acme")
	require.Len(t, dls, 1)
	assert.Equal(t, store.DeadLetterJob, dls[0].Kind)
	assert.Equal(t, key.ID, dls[0].JobID)
	assert.Equal(t, dl.Reason, dls[0].Reason)
	assert.Equal(t, dl.Body, dls[0].Body)

	ok, err = s.FailQueued(ctx, key, e, dl)
	require.NoError(t, err)
	assert.False(t, ok, "a failed job is not queued")

	// Refused: nothing changes and no dead letter is written.
	for _, st := range []job.Status{job.StatusRunning, job.StatusRetrying, job.StatusSucceeded, job.StatusCancelled} {
		k := insertKey(t, s, sampleJob("acme", "fq-"+string(st)))
		forceStatus(t, pool, k, st)
		before := mustGet(t, s, k)
		ok, err := s.FailQueued(ctx, k, e, deadLetterOf(k))
		require.NoError(t, err, st)
		assert.False(t, ok, st)
		assert.Equal(t, before, mustGet(t, s, k), st)
	}
	ok, err = s.FailQueued(ctx, job.Key{Tenant: "acme", ID: "missing"}, e, deadLetterOf(job.Key{Tenant: "acme", ID: "missing"}))
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Len(t, deadLetters(t, s, "acme"), 1, "only the failed job has a dead letter")
}

func TestDeadByBroker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	cases := []struct {
		name    string
		prepare func(t *testing.T, j job.Job)
		dead    bool
	}{
		{"queued", func(t *testing.T, j job.Job) { mustInsert(t, s, j) }, true},
		{"retrying, not due", func(t *testing.T, j job.Job) {
			c := insertClaimed(t, s, j, "w1", time.Minute)
			ok, err := s.ScheduleRetry(ctx, c.AttemptOf("w1"), time.Now().Add(time.Hour), attemptErr("server_error"))
			require.NoError(t, err)
			require.True(t, ok)
		}, true},
		{"running, lease expired", func(t *testing.T, j job.Job) {
			insertClaimed(t, s, j, "w1", time.Minute)
			expireLease(t, pool, j.Key())
		}, true},
		{"running, live lease", func(t *testing.T, j job.Job) { insertClaimed(t, s, j, "w1", time.Hour) }, false},
		{"succeeded", func(t *testing.T, j job.Job) {
			c := insertClaimed(t, s, j, "w1", time.Minute)
			ok, err := s.Complete(ctx, c.AttemptOf("w1"), result())
			require.NoError(t, err)
			require.True(t, ok)
		}, false},
		{"failed", func(t *testing.T, j job.Job) { mustInsert(t, s, j); forceStatus(t, pool, j.Key(), job.StatusFailed) }, false},
		{"dead", func(t *testing.T, j job.Job) { mustInsert(t, s, j); forceStatus(t, pool, j.Key(), job.StatusDead) }, false},
		{"cancelled", func(t *testing.T, j job.Job) { mustInsert(t, s, j); forceStatus(t, pool, j.Key(), job.StatusCancelled) }, false},
		{"missing", func(*testing.T, job.Job) {}, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tenant := "t" + string(rune('a'+i)) // a tenant per case keeps the dead letters apart
			j := sampleJob(tenant, "delivered-too-often")
			c.prepare(t, j)
			before, _ := s.Get(ctx, j.Key())
			dl := deadLetterOf(j.Key())
			dl.Kind = store.DeadLetterMessage // DeadByBroker records the job's own dead letter whatever is passed
			dl.Reason = "delivery limit"
			ok, err := s.DeadByBroker(ctx, j.Key(), store.AttemptError{Kind: "delivery_limit", Message: "redelivered 5 times"}, dl)
			require.NoError(t, err)
			assert.Equal(t, c.dead, ok)
			dls := deadLetters(t, s, tenant)
			if !c.dead {
				assert.Empty(t, dls, "no dead letter when refused")
				if c.name != "missing" {
					assert.Equal(t, before, mustGet(t, s, j.Key()), "refused: nothing changes")
				}
				return
			}
			rec := mustGet(t, s, j.Key())
			assert.Equal(t, job.StatusDead, rec.Status)
			require.NotNil(t, rec.CompletedAt)
			assert.Empty(t, rec.LeaseOwner)
			assert.Nil(t, rec.LeaseExpiresAt)
			assert.Nil(t, rec.NextAttemptAt)
			require.NotEmpty(t, rec.Errors)
			assert.Equal(t, "delivery_limit", rec.Errors[len(rec.Errors)-1].Kind)
			require.Len(t, dls, 1)
			assert.Equal(t, store.DeadLetterJob, dls[0].Kind)
			assert.Equal(t, j.ID, dls[0].JobID)
			assert.Equal(t, "delivery limit", dls[0].Reason)
			assert.Equal(t, rec.Attempts, dls[0].Attempts, "the dead letter counts the job's attempts")

			ok, err = s.DeadByBroker(ctx, j.Key(), store.AttemptError{Kind: "delivery_limit", Message: "again"}, dl)
			require.NoError(t, err)
			assert.False(t, ok, "a dead job is not moved again")
			assert.Len(t, deadLetters(t, s, tenant), 1)
		})
	}
}

// insertKey stores j (it must be new) and returns its key.
func insertKey(t testing.TB, s *store.Store, j job.Job) job.Key {
	t.Helper()
	rec := mustInsert(t, s, j)
	return rec.Key()
}

// TakeUnenqueued returns what Unenqueued finds and marks it enqueued in the
// same statement: a second take finds nothing, and a row claimed meanwhile
// is not taken.
func TestTakeUnenqueued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	queued := insertKey(t, s, sampleJob("acme", "take-queued"))
	require.NoError(t, s.MarkUnenqueued(ctx, queued))
	claimed := insertKey(t, s, sampleJob("acme", "take-claimed"))
	require.NoError(t, s.MarkUnenqueued(ctx, claimed))
	c, err := s.Claim(ctx, claimed, "w1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)

	recs, err := s.TakeUnenqueued(ctx, 100)
	require.NoError(t, err)
	require.Equal(t, []job.Key{queued}, keysOf(recs), "a running job needs no message")
	require.NotNil(t, recs[0].EnqueuedAt, "returned as marked")
	again, err := s.TakeUnenqueued(ctx, 100)
	require.NoError(t, err)
	require.Empty(t, again, "taken once")
	found, err := s.Unenqueued(ctx, 100)
	require.NoError(t, err)
	require.Empty(t, found)

	require.NoError(t, s.MarkUnenqueued(ctx, queued))
	recs, err = s.TakeUnenqueued(ctx, 100)
	require.NoError(t, err)
	require.Equal(t, []job.Key{queued}, keysOf(recs), "unmarked after a failed publish: taken again")
}

// TakeUnenqueued takes lane by lane, the most urgent first, each lane
// oldest first, up to its limit over all lanes.
func TestTakeUnenqueuedMostUrgentLaneFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	var keys []job.Key
	for _, c := range []struct {
		id   string
		lane job.Priority
	}{{"low-1", job.PriorityLow}, {"normal-1", job.PriorityNormal}, {"high-1", job.PriorityHigh}, {"normal-2", job.PriorityNormal}} {
		j := sampleJob("acme", c.id)
		j.Priority = c.lane
		k := insertKey(t, s, j)
		require.NoError(t, s.MarkUnenqueued(ctx, k))
		keys = append(keys, k)
	}
	recs, err := s.TakeUnenqueued(ctx, 3)
	require.NoError(t, err)
	assert.Equal(t, []job.Key{keys[2], keys[1], keys[3]}, keysOf(recs))
	recs, err = s.TakeUnenqueued(ctx, 3)
	require.NoError(t, err)
	assert.Equal(t, []job.Key{keys[0]}, keysOf(recs))
}
