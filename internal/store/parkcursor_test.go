package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// lockKeys locks up to n parked jobs of floodGroup in s and returns the
// lock with its keys (no lock when none was free).
func lockKeys(t *testing.T, s *store.Store, n int) (*store.ParkedLock, []job.Key) {
	t.Helper()
	l, err := s.LockParked(context.Background(), floodGroup, n, "w1", time.Minute)
	require.NoError(t, err)
	if l == nil {
		return nil, nil
	}
	return l, keysOf(l.Records())
}

// settleAll writes every job of l as succeeded.
func settleAll(t *testing.T, s *store.Store, l *store.ParkedLock) {
	t.Helper()
	res := store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{}`), Trace: store.Trace{HTTPStatus: 200}}
	var done []store.ParkedSuccess
	for _, k := range keysOf(l.Records()) {
		done = append(done, store.ParkedSuccess{Key: k, Result: res})
	}
	_, err := s.SettleParked(context.Background(), l, done, nil)
	require.NoError(t, err)
}

// A store's next lock of a group starts where its last one ended
// (parkcursor.go). Rows handed back before that point are taken all the
// same: another replica's, by a lock from the group's start once nothing
// past the point is free; this store's own, by its very next lock.
func TestParkedLocksStartWhereTheLastEnded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood := parkFlood(t, s, 10)
	replica := store.New(pool) // another consumer: a cursor of its own

	held, keys := lockKeys(t, replica, 2)
	require.Equal(t, flood[:2], keys)
	a, keys := lockKeys(t, s, 3)
	require.Equal(t, flood[2:5], keys, "past the other replica's rows")
	settleAll(t, s, a)
	require.NoError(t, replica.ReleaseParked(ctx, held))

	b, keys := lockKeys(t, s, 3)
	assert.Equal(t, flood[5:8], keys, "from where the last lock ended, not from the released rows")
	c, keys := lockKeys(t, s, 3)
	assert.Equal(t, flood[8:10], keys, "the rest past the cursor")
	d, keys := lockKeys(t, s, 3)
	assert.Equal(t, flood[:2], keys, "a short lock drops the cursor: the released rows are found")
	settleAll(t, s, b)
	settleAll(t, s, c)

	// This store's own release drops its cursor at once.
	require.NoError(t, s.ReleaseParked(ctx, d))
	e, keys := lockKeys(t, s, 1)
	assert.Equal(t, flood[:1], keys)
	// So does a settle that leaves a locked row parked.
	_, err := s.SettleParked(ctx, e, nil, nil)
	require.NoError(t, err)
	f, keys := lockKeys(t, s, 2)
	assert.Equal(t, flood[:2], keys)
	settleAll(t, s, f)
	none, _ := lockKeys(t, s, 2)
	assert.Nil(t, none, "every job of the group ran once")
}

// Nothing free past the cursor (the rows there are locked by an open lock
// of this store): the same lock reads the group from its start.
func TestParkedLockRereadsFromTheStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood := parkFlood(t, s, 6)
	replica := store.New(pool)

	held, keys := lockKeys(t, replica, 2)
	require.Equal(t, flood[:2], keys)
	a, keys := lockKeys(t, s, 2)
	require.Equal(t, flood[2:4], keys)
	b, keys := lockKeys(t, s, 2)
	require.Equal(t, flood[4:6], keys)
	require.NoError(t, replica.ReleaseParked(ctx, held))
	c, keys := lockKeys(t, s, 2)
	assert.Equal(t, flood[:2], keys)
	for _, l := range []*store.ParkedLock{a, b, c} {
		settleAll(t, s, l)
	}
}

// Rows of one insert share their created_at, and a lock may end inside
// them: the next one starts at that created_at, not after it.
func TestParkedLockCursorKeepsRowsOfTheSameInstant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	var jobs []job.Job
	var keys []job.Key
	for i := range 6 {
		j := sampleJob("flood", fmt.Sprintf("same-%d", i))
		jobs, keys = append(jobs, j), append(keys, j.Key())
	}
	_, err := s.InsertBatch(ctx, jobs)
	require.NoError(t, err)
	_, err = s.Park(ctx, keys)
	require.NoError(t, err)

	a, first := lockKeys(t, s, 4)
	require.Len(t, first, 4)
	settleAll(t, s, a)
	b, rest := lockKeys(t, s, 4)
	assert.Len(t, rest, 2)
	assert.ElementsMatch(t, keys, append(first, rest...))
	settleAll(t, s, b)
}

// The intake's probe looks past the store's cursor first, and finds a
// group's parked rows all the same when the only ones are older: a row
// another replica handed back. A new job of the group is parked behind it.
func TestParkedProbeFindsRowsBeforeTheCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood := parkFlood(t, s, 4)
	replica := store.New(pool)

	held, keys := lockKeys(t, replica, 1)
	require.Equal(t, flood[:1], keys)
	a, keys := lockKeys(t, s, 3)
	require.Equal(t, flood[1:4], keys)
	settleAll(t, s, a) // nothing parked past this store's cursor
	require.NoError(t, replica.ReleaseParked(ctx, held))

	late := sampleJob("flood", "late")
	absent, err := s.Absent(ctx, []job.Job{late})
	require.NoError(t, err)
	assert.Equal(t, []bool{false}, absent, "its group has a parked job: not written once")
	ins, err := s.InsertBatch(ctx, []job.Job{late})
	require.NoError(t, err)
	require.True(t, ins[0].Created)
	assert.True(t, ins[0].Parked, "parked behind flood[0]")
}

// UnparkClaiming takes from the group's cursor as a lock does.
func TestUnparkClaimingStartsWhereTheLastTakeEnded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood := parkFlood(t, s, 6)
	replica := store.New(pool)
	claim := func(n int) []job.Key {
		recs, err := s.UnparkClaiming(ctx, floodGroup, n, "w1", time.Minute)
		require.NoError(t, err)
		return keysOf(recs)
	}

	held, keys := lockKeys(t, replica, 1)
	require.Equal(t, flood[:1], keys)
	require.ElementsMatch(t, flood[1:3], claim(2))
	require.NoError(t, replica.ReleaseParked(ctx, held))
	assert.ElementsMatch(t, flood[3:5], claim(2), "past the cursor first")
	assert.ElementsMatch(t, flood[5:6], claim(2))
	assert.ElementsMatch(t, flood[:1], claim(2), "then from the group's start")
}

// A take from the group's start skips the rows a lock holds; should this
// store hand those rows back before the take records its end, the take
// sets no cursor past them: the store's very next take finds them.
func TestAReleaseDuringATakeFromTheStartIsNotLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	flood := parkFlood(t, s, 6)
	held, keys := lockKeys(t, store.New(pool), 2)
	require.Equal(t, flood[:2], keys)

	other := store.New(pool) // runs the take's statement
	var inFlight *store.ParkedLock
	_, err := store.FromCursor(s, floodGroup, 2, func(start *time.Time) ([]store.Record, error) {
		require.Nil(t, start, "from the group's start")
		l, err := other.LockParked(ctx, floodGroup, 2, "w1", time.Minute) // held's rows are skipped
		require.NoError(t, err)
		inFlight = l
		require.NoError(t, s.ReleaseParked(ctx, held)) // not under the group's gate
		return l.Records(), nil
	})
	require.NoError(t, err)
	require.Equal(t, flood[2:4], keysOf(inFlight.Records()))

	next, keys := lockKeys(t, s, 2)
	assert.Equal(t, flood[:2], keys, "rows this store released are taken by its very next take")
	require.NoError(t, s.ReleaseParked(ctx, next))
	require.NoError(t, other.ReleaseParked(ctx, inFlight))
}
