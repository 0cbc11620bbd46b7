package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// TestParkedLockSettles: locked parked jobs are skipped by every other
// unparker while the lock is open; SettleParked writes the succeeded ones as a
// claim and a completion would (one attempt, usage, outbox row), claims
// the unfinished ones, and leaves the rest parked.
func TestParkedLockSettles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood := parkFlood(t, s, 6)
	g := floodGroup

	l, err := s.LockParked(ctx, g, 4, "w1", time.Minute)
	require.NoError(t, err)
	require.NotNil(t, l)
	recs := l.Records()
	require.Len(t, recs, 4)
	for i, rec := range recs {
		assert.Equal(t, flood[i], rec.Key(), "oldest first")
		assert.Equal(t, job.StatusRunning, rec.Status)
		assert.Equal(t, 1, rec.Attempts)
		assert.Equal(t, "w1", rec.LeaseOwner)
		assert.Equal(t, job.StatusQueued, mustGet(t, s, rec.Key()).Status, "written only at Settle")
	}
	other, err := s.UnparkClaiming(ctx, g, 100, "w2", time.Minute)
	require.NoError(t, err)
	require.Len(t, other, 2, "another unparker skips the locked rows")
	assert.Equal(t, []job.Key{flood[4], flood[5]}, []job.Key{other[0].Key(), other[1].Key()})

	res := store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{"ok": true}`), PromptTokens: 5, CompletionTokens: 3,
		Trace: store.Trace{HTTPStatus: 200}}
	ok, err := s.SettleParked(ctx, l, []store.ParkedSuccess{{Key: flood[0], Result: res}, {Key: flood[1], Result: res}}, []job.Key{flood[2]})
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true}, ok)

	for _, k := range flood[:2] {
		rec := mustGet(t, s, k)
		assert.Equal(t, job.StatusSucceeded, rec.Status)
		assert.Equal(t, 1, rec.Attempts)
		assert.NotNil(t, rec.StartedAt)
		assert.NotNil(t, rec.CompletedAt)
		assert.Empty(t, rec.LeaseOwner)
		assert.JSONEq(t, `{"ok": true}`, string(rec.Response))
	}
	claimed := mustGet(t, s, flood[2])
	assert.Equal(t, job.StatusRunning, claimed.Status)
	assert.Equal(t, "w1", claimed.LeaseOwner)
	assert.Equal(t, 1, claimed.Attempts)
	done, err := s.Complete(ctx, store.Attempt{Key: flood[2], Owner: "w1", N: 1}, res)
	require.NoError(t, err)
	assert.True(t, done, "the claim is an attempt like any other")

	left := mustGet(t, s, flood[3])
	assert.Equal(t, job.StatusQueued, left.Status)
	assert.Equal(t, 0, left.Attempts)
	again, err := s.UnparkClaiming(ctx, g, 100, "w2", time.Minute)
	require.NoError(t, err)
	require.Len(t, again, 1, "a locked job in neither list is parked again")
	assert.Equal(t, flood[3], again[0].Key())

	var events, withXid, logged int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM result_events WHERE tenant = 'flood' AND status = 'succeeded'`).Scan(&events))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE tenant = 'flood' AND finished_xid IS NOT NULL`).Scan(&withXid))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE tenant = 'flood' AND jsonb_array_length(attempt_log) = 1
		AND attempt_log->0->>'outcome' = 'succeeded' AND parked_at IS NULL`).Scan(&logged))
	assert.Equal(t, 3, events, "one outbox row each")
	assert.Equal(t, 3, withXid)
	assert.Equal(t, 3, logged, "one attempt logged each")
	var calls, in int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(calls), sum(input_tokens) FROM usage_hours WHERE tenant = 'flood'`).Scan(&calls, &in))
	assert.Equal(t, []int64{3, 15}, []int64{calls, in})
}

// TestParkedLockReleased: ReleaseParked, or a SettleParked that fails, writes nothing
// and leaves every locked job parked for the next unparker.
func TestParkedLockReleased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood := parkFlood(t, s, 3)
	g := floodGroup
	// The settle's finish fails, after its claim ran, for a reason that is
	// neither the values' (Unstorable) nor one worth another try.
	for _, sql := range []string{
		`CREATE FUNCTION refuse_finish() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'no finish here' USING ERRCODE = 'P0001'; END $$`,
		`CREATE TRIGGER refuse_finish BEFORE UPDATE ON jobs FOR EACH ROW
			WHEN (NEW.status = 'succeeded' AND NEW.id = '` + flood[0].ID + `') EXECUTE FUNCTION refuse_finish()`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}

	l, err := s.LockParked(ctx, g, 2, "w1", time.Minute)
	require.NoError(t, err)
	require.NoError(t, s.ReleaseParked(ctx, l))
	l, err = s.LockParked(ctx, g, 10, "w1", time.Minute)
	require.NoError(t, err)
	require.Len(t, l.Records(), 3, "released: lockable again")
	none, err := s.LockParked(ctx, g, 10, "w2", time.Minute)
	require.NoError(t, err)
	assert.Nil(t, none, "all locked: nothing to lock")

	res := store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{"choices": []}`)}
	_, err = s.SettleParked(ctx, l, []store.ParkedSuccess{{Key: flood[0], Result: res}}, []job.Key{flood[1]})
	require.ErrorContains(t, err, "no finish here")
	var refused *store.AnswersRefused
	require.False(t, errors.As(err, &refused))
	for _, k := range flood {
		rec := mustGet(t, s, k)
		assert.Equal(t, job.StatusQueued, rec.Status)
		assert.Equal(t, 0, rec.Attempts)
	}
	again, err := s.UnparkClaiming(ctx, g, 10, "w2", time.Minute)
	require.NoError(t, err)
	assert.Len(t, again, 3, "still parked")
}

// An answer Postgres refuses (store.Unstorable) fails the settle's finish
// at every try: the settle claims the succeeded jobs with the others
// instead, so that their answers, paid for, are stored one by one.
func TestParkedSettleClaimsWhenAnAnswerIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	flood := parkFlood(t, s, 3)
	l, err := s.LockParked(ctx, floodGroup, 10, "w1", time.Minute)
	require.NoError(t, err)
	require.Len(t, l.Records(), 3)
	good := store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{"choices": []}`)}
	bad := store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{"bad": `)}
	_, err = s.SettleParked(ctx, l, []store.ParkedSuccess{{Key: flood[0], Result: good}, {Key: flood[1], Result: bad}}, nil)
	var refused *store.AnswersRefused
	require.ErrorAs(t, err, &refused, "jsonb refuses what is not JSON")
	assert.True(t, store.Unstorable(refused.Err))
	for _, k := range flood[:2] {
		rec := mustGet(t, s, k)
		assert.Equal(t, job.StatusRunning, rec.Status, k.ID)
		assert.Equal(t, "w1", rec.LeaseOwner)
		assert.Equal(t, 1, rec.Attempts)
		ok, err := s.Complete(ctx, store.Attempt{Key: k, Owner: "w1", N: 1}, good)
		require.NoError(t, err)
		assert.True(t, ok, "the claim is the attempt the answer is stored under")
	}
	again, err := s.UnparkClaiming(ctx, floodGroup, 10, "w2", time.Minute)
	require.NoError(t, err)
	require.Len(t, again, 1, "a locked job in neither list stays parked")
	assert.Equal(t, flood[2], again[0].Key())
}

// TestParkedLockLostWithItsConnection: a lock whose transaction dies with
// its connection (its worker died) leaves its jobs parked, and the next
// look for lost locks marks them as an attempt whose lease expired: the
// reconciler takes them over, and the claim that follows is their second
// attempt.
func TestParkedLockLostWithItsConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood := parkFlood(t, s, 3)
	g := floodGroup

	l, err := s.LockParked(ctx, g, 2, "w1", time.Minute)
	require.NoError(t, err)
	require.Len(t, l.Records(), 2)
	var pid int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT pid FROM parked_locks WHERE $1 = ANY(ids)`, flood[0].ID).Scan(&pid))
	var killed bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid).Scan(&killed))
	require.True(t, killed)
	defer func() { _ = s.ReleaseParked(ctx, l) }() // gives the dead connection back to the pool

	require.NoError(t, s.ReclaimLostLocks(ctx))
	next, err := s.LockParked(ctx, g, 10, "w2", time.Minute)
	require.NoError(t, err)
	require.NotNil(t, next)
	require.Len(t, next.Records(), 1, "the lost jobs are no longer parked")
	assert.Equal(t, flood[2], next.Records()[0].Key())
	require.NoError(t, s.ReleaseParked(ctx, next))
	for _, k := range flood[:2] {
		rec := mustGet(t, s, k)
		assert.Equal(t, job.StatusRunning, rec.Status)
		assert.Equal(t, 1, rec.Attempts, "the lost attempt counts")
		assert.Equal(t, "w1", rec.LeaseOwner)
	}
	orphans, err := s.TakeOrphaned(ctx, 10)
	require.NoError(t, err)
	var taken []job.Key
	for _, r := range orphans {
		taken = append(taken, r.Key())
	}
	assert.ElementsMatch(t, flood[:2], taken, "the reconciler takes them over")
	c, err := s.Claim(ctx, flood[0], "w3", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, 2, c.Attempt, "the next claim is the second attempt")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM parked_locks`).Scan(&left))
	assert.Zero(t, left)
}

// A settle whose statement is a deadlock's victim runs its statements
// again from a savepoint: the batch's answers, paid for, are written
// instead of rolled back with the transaction.
func TestParkedLockSettleOutlivesADeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood := parkFlood(t, s, 3)
	for _, sql := range []string{
		`CREATE SEQUENCE settles`, // not rolled back with the statement it counts
		`CREATE FUNCTION first_settle_deadlocks() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('settles') = 1 THEN
				RAISE EXCEPTION 'a deadlock, for the test' USING ERRCODE = 'deadlock_detected';
			END IF;
			RETURN OLD;
		END $$`,
		`CREATE TRIGGER first_settle_deadlocks BEFORE DELETE ON parked_locks FOR EACH ROW EXECUTE FUNCTION first_settle_deadlocks()`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}

	l, err := s.LockParked(ctx, floodGroup, 2, "w1", time.Minute)
	require.NoError(t, err)
	require.Len(t, l.Records(), 2)
	answer := store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{"ok": true}`)}
	ok, err := s.SettleParked(ctx, l, []store.ParkedSuccess{{Key: flood[0], Result: answer}}, []job.Key{flood[1]})
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, ok)
	assert.Equal(t, job.StatusSucceeded, mustGet(t, s, flood[0]).Status)
	assert.Equal(t, job.StatusRunning, mustGet(t, s, flood[1]).Status)
	var tries int
	require.NoError(t, pool.QueryRow(ctx, `SELECT last_value FROM settles`).Scan(&tries))
	assert.Equal(t, 2, tries, "the settle's statements ran twice")
	var records int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM parked_locks`).Scan(&records))
	assert.Zero(t, records, "the lock's record is gone with the settle")
}

// A look for lost locks that takes a live lock for lost (replicas whose
// Postgres roles cannot see each other's transactions, a pooler that
// reports its own pid) skips the rows that lock holds instead of waiting
// for them. It used to wait, and deadlock with the live lock's settle,
// which deletes the record the look had taken: one of the two failed.
func TestReclaimSkipsTheRowsOfALiveLockItTakesForLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood, l, _ := lockTakenForLost(t, s, pool)

	reclaimed := make(chan error, 1)
	go func() { reclaimed <- s.ReclaimLostLocks(ctx) }()
	var reclaimErr error
	done := false
	require.Eventually(t, func() bool {
		select {
		case reclaimErr = <-reclaimed:
			done = true
			return true
		default:
		}
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'WITH lost AS%'`).Scan(&waiting))
		return waiting > 0
	}, time.Minute, 5*time.Millisecond, "the look for lost locks neither ended nor waited")

	if done {
		assert.Equal(t, 1, lockRecords(t, pool), "the record of a lock whose rows are held is kept")
	}

	answer := store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{"ok": true}`)}
	ok, err := s.SettleParked(ctx, l, []store.ParkedSuccess{{Key: flood[0], Result: answer}}, []job.Key{flood[1]})
	if !done {
		reclaimErr = <-reclaimed
	}
	require.NoError(t, err, "the live lock's settle")
	require.NoError(t, reclaimErr, "the look for lost locks")
	assert.True(t, done, "the look for lost locks waited for a live lock's rows")
	assert.Zero(t, lockRecords(t, pool), "the settle deletes its record")
	assert.Equal(t, []bool{true}, ok)
	first, second := mustGet(t, s, flood[0]), mustGet(t, s, flood[1])
	assert.Equal(t, job.StatusSucceeded, first.Status)
	assert.Equal(t, 1, first.Attempts, "no lost attempt charged to a live lock's job")
	assert.Equal(t, job.StatusRunning, second.Status)
	assert.Equal(t, 1, second.Attempts)
}

// A live lock taken for lost keeps its record (its rows are held), so when
// its batch dies after that look, the next look still charges its jobs the
// attempt: a job that kills its worker does not run for ever uncounted.
func TestReclaimChargesALockTakenForLostWhenItDiesLater(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood, l, pid := lockTakenForLost(t, s, pool)
	defer func() { _ = s.ReleaseParked(ctx, l) }() // gives the dead connection back to the pool

	require.NoError(t, s.ReclaimLostLocks(ctx), "the look that takes the live lock for lost")
	assert.Equal(t, 1, lockRecords(t, pool), "kept while its rows are held")
	for _, k := range flood[:2] {
		rec := mustGet(t, s, k)
		assert.Equal(t, job.StatusQueued, rec.Status, "a live lock's rows are not charged")
		assert.Zero(t, rec.Attempts)
	}

	var killed bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid).Scan(&killed))
	require.True(t, killed)
	require.NoError(t, s.ReclaimLostLocks(ctx), "the look after the batch died")
	for _, k := range flood[:2] {
		rec := mustGet(t, s, k)
		assert.Equal(t, job.StatusRunning, rec.Status)
		assert.Equal(t, 1, rec.Attempts, "the lost attempt counts")
		assert.Equal(t, "w1", rec.LeaseOwner)
	}
	assert.Equal(t, job.StatusQueued, mustGet(t, s, flood[2]).Status, "a job the lock did not hold is untouched")
	assert.Zero(t, lockRecords(t, pool))
}

// lockTakenForLost parks three jobs and locks the first two as "w1"; the
// lock's record then shows a pid no backend has, as a role that cannot see
// the lock's transaction reads it. pid is the lock's real backend.
func lockTakenForLost(t *testing.T, s *store.Store, pool *pgxpool.Pool) (flood []job.Key, l *store.ParkedLock, pid int32) {
	t.Helper()
	ctx := context.Background()
	flood = parkFlood(t, s, 3)
	l, err := s.LockParked(ctx, floodGroup, 2, "w1", time.Minute)
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, `SELECT pid FROM parked_locks`).Scan(&pid))
	_, err = pool.Exec(ctx, `UPDATE parked_locks SET pid = -1`)
	require.NoError(t, err)
	return flood, l, pid
}

func lockRecords(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM parked_locks`).Scan(&n))
	return n
}

// A lost lock's record kept for a row another live lock holds is cut down
// to that row: its other jobs, charged at the first look, taken over and
// parked again, are not charged a second time at the next look.
func TestReclaimChargesALostAttemptOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood := parkFlood(t, s, 3)
	// This replica has looked for lost locks (at its first lock): its next
	// look is the test's own.
	steady, err := s.LockParked(ctx, store.ParkedGroup{Tenant: "steady", Model: "qwen-plus", Lane: job.PriorityNormal}, 1, "w2", time.Minute)
	require.NoError(t, err)
	require.NoError(t, s.ReleaseParked(ctx, steady))
	// Another replica's batch, whose connection dies.
	dead, err := store.New(pool).LockParked(ctx, floodGroup, 2, "w1", time.Minute) // flood[0], flood[1]
	require.NoError(t, err)
	var pid int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT pid FROM parked_locks`).Scan(&pid))
	var killed bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid).Scan(&killed))
	require.True(t, killed)
	defer func() { _ = s.ReleaseParked(ctx, dead) }() // gives the dead connection back to the pool

	live, err := s.LockParked(ctx, floodGroup, 1, "w2", time.Minute) // a live batch takes flood[0]
	require.NoError(t, err)
	require.Equal(t, flood[0], live.Records()[0].Key())
	defer func() { _ = s.ReleaseParked(ctx, live) }()

	require.NoError(t, s.ReclaimLostLocks(ctx))
	assert.Equal(t, 1, mustGet(t, s, flood[1]).Attempts, "the lost attempt is charged")
	var ids []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT ids FROM parked_locks WHERE owner = 'w1'`).Scan(&ids))
	assert.Equal(t, []string{flood[0].ID}, ids, "the record is kept for the held row alone")

	// The reconciler takes it over, a claim runs it, the consumer parks it again.
	c, err := s.Claim(ctx, flood[1], "w3", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	parked, err := s.ParkClaimed(ctx, []job.Key{flood[1]}, "w3")
	require.NoError(t, err)
	require.Equal(t, []bool{true}, parked)
	require.Equal(t, 1, mustGet(t, s, flood[1]).Attempts)

	require.NoError(t, s.ReclaimLostLocks(ctx))
	assert.Equal(t, 1, mustGet(t, s, flood[1]).Attempts, "one lost attempt, charged once")
	assert.Equal(t, job.StatusQueued, mustGet(t, s, flood[1]).Status)
}
