package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)

	// A malformed message: no job id, no tenant, body kept byte for byte.
	body := []byte{'{', 0xff, 0x00, '"', 'x'}
	malformed, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Kind: store.DeadLetterMessage, Lane: "normal",
		Reason: "malformed: invalid UTF-8", Body: body})
	require.NoError(t, err)

	first := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	id, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Tenant: "acme", JobID: "j1", Lane: "high",
		Reason: "attempts exhausted", Attempts: 3, LastError: "429", Body: []byte(`{"id":"j1"}`), FirstFailedAt: first})
	require.NoError(t, err)
	// The same job dead-lettered again keeps its row.
	again, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Tenant: "acme", JobID: "j1", Lane: "high",
		Reason: "deadline passed", Attempts: 4, LastError: "timeout", Body: []byte(`{"id":"j1","v":2}`)})
	require.NoError(t, err)
	assert.Equal(t, id, again)

	for i := range 5 {
		_, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Tenant: "acme", JobID: fmt.Sprintf("k%d", i), Lane: "low",
			Reason: "failed", Body: []byte("{}")})
		require.NoError(t, err)
	}

	def, next, err := s.ListDeadLetters(ctx, job.DefaultTenant, "", 0)
	require.NoError(t, err)
	assert.Empty(t, next)
	require.Len(t, def, 1)
	assert.Equal(t, malformed, def[0].ID)
	assert.Equal(t, body, def[0].Body)
	assert.Empty(t, def[0].JobID)
	assert.Equal(t, store.DeadLetterMessage, def[0].Kind)

	var all []store.DeadLetterRow
	cursor := ""
	for {
		page, next, err := s.ListDeadLetters(ctx, "acme", cursor, 2)
		require.NoError(t, err)
		all = append(all, page...)
		if next == "" {
			break
		}
		cursor = next
	}
	require.Len(t, all, 6, "the other tenant's and the duplicate are not listed")
	j1 := all[0]
	assert.Equal(t, "j1", j1.JobID)
	assert.Equal(t, store.DeadLetterJob, j1.Kind, "kind job is the default")
	assert.Equal(t, "deadline passed", j1.Reason)
	assert.Equal(t, 4, j1.Attempts)
	assert.Equal(t, `{"id":"j1","v":2}`, string(j1.Body))
	assert.True(t, first.Equal(j1.FirstFailedAt), "first failure kept: %v vs %v", first, j1.FirstFailedAt)
	assert.True(t, j1.LastFailedAt.After(first))

	_, err = s.TakeDeadLetter(ctx, "globex", id)
	assert.ErrorIs(t, err, store.ErrNotFound, "another tenant cannot take it")
	taken, err := s.TakeDeadLetter(ctx, "acme", id)
	require.NoError(t, err)
	assert.Equal(t, j1, taken)
	_, err = s.TakeDeadLetter(ctx, "acme", id)
	assert.ErrorIs(t, err, store.ErrNotFound, "taken once")

	_, _, err = s.ListDeadLetters(ctx, "acme", "x", 0)
	assert.ErrorIs(t, err, store.ErrBadCursor)
}

// A job has one dead letter (kind job, upserted on (tenant, job_id)); a
// message (kind message) always gets a row of its own, so several
// conflicting messages for one id are all kept.
func TestDeadLetterKinds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	row := func(kind, id, body string) store.DeadLetterRow {
		return store.DeadLetterRow{Kind: kind, Tenant: "acme", JobID: id, Lane: "normal", Reason: "r", Body: []byte(body)}
	}
	jobID, err := s.RecordDeadLetter(ctx, row(store.DeadLetterJob, "x", `{"v":1}`))
	require.NoError(t, err)
	var msgIDs []int64
	for i := range 3 {
		id, err := s.RecordDeadLetter(ctx, row(store.DeadLetterMessage, "x", fmt.Sprintf(`{"m":%d}`, i)))
		require.NoError(t, err)
		msgIDs = append(msgIDs, id)
	}
	again, err := s.RecordDeadLetter(ctx, row("", "x", `{"v":2}`)) // "" is kind job
	require.NoError(t, err)
	assert.Equal(t, jobID, again, "kind job: one row per job")
	dup, err := s.RecordDeadLetter(ctx, row(store.DeadLetterMessage, "x", `{"m":0}`))
	require.NoError(t, err)
	msgIDs = append(msgIDs, dup)

	// The same id in another tenant is another job.
	other, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Tenant: "globex", JobID: "x", Lane: "normal", Reason: "r", Body: []byte("{}")})
	require.NoError(t, err)
	assert.NotEqual(t, jobID, other)

	all := deadLetters(t, s, "acme")
	require.Len(t, all, 1+len(msgIDs), "one job row and every message")
	kinds := map[string]int{}
	for _, d := range all {
		kinds[d.Kind]++
		assert.Equal(t, "x", d.JobID)
	}
	assert.Equal(t, map[string]int{store.DeadLetterJob: 1, store.DeadLetterMessage: len(msgIDs)}, kinds)
	assert.Equal(t, jobID, all[0].ID)
	assert.Equal(t, `{"v":2}`, string(all[0].Body), "the job's row takes the newest body")
	for i, id := range msgIDs {
		assert.Equal(t, id, all[1+i].ID, "message %d has a row of its own", i)
	}

	_, err = s.RecordDeadLetter(ctx, row("other", "y", "{}"))
	assert.Error(t, err, "an unknown kind is refused by dead_letters_kind_valid")
}

// MarkDeadLettered ends the running attempt as dead and records its dead
// letter in one transaction; when the claim no longer holds it does
// neither.
func TestMarkDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	j := sampleJob("acme", "doomed")
	c := insertClaimed(t, s, j, "w1", time.Minute)
	dl := store.DeadLetterRow{Kind: store.DeadLetterMessage, Tenant: "acme", JobID: j.ID, Lane: "normal",
		Reason: "attempts exhausted", Attempts: c.Attempt, LastError: "500", Body: []byte(`{"id":"doomed"}`)}

	for _, stale := range []store.Attempt{
		{Key: j.Key(), Owner: "w2", N: c.Attempt},
		{Key: j.Key(), Owner: "w1", N: c.Attempt + 1},
	} {
		ok, err := s.MarkDeadLettered(ctx, stale, attemptErr("server_error"), dl)
		require.NoError(t, err)
		assert.False(t, ok, "%s/%d holds no claim", stale.Owner, stale.N)
	}
	assert.Equal(t, job.StatusRunning, mustGet(t, s, j.Key()).Status)
	assert.Empty(t, deadLetters(t, s, "acme"), "no dead letter without the move")

	ok, err := s.MarkDeadLettered(ctx, c.AttemptOf("w1"), attemptErr("server_error"), dl)
	require.NoError(t, err)
	require.True(t, ok)
	rec := mustGet(t, s, j.Key())
	assert.Equal(t, job.StatusDead, rec.Status)
	assert.Empty(t, rec.LeaseOwner)
	require.NotNil(t, rec.CompletedAt)
	require.Len(t, rec.Errors, 1)
	assert.Equal(t, c.Attempt, rec.Errors[0].Attempt)
	dls := deadLetters(t, s, "acme")
	require.Len(t, dls, 1)
	assert.Equal(t, store.DeadLetterJob, dls[0].Kind, "a job's dead letter is kind job whatever is passed")
	assert.Equal(t, j.ID, dls[0].JobID)
	assert.Equal(t, "attempts exhausted", dls[0].Reason)
	assert.Equal(t, "500", dls[0].LastError)

	ok, err = s.MarkDeadLettered(ctx, c.AttemptOf("w1"), attemptErr("server_error"), dl)
	require.NoError(t, err)
	assert.False(t, ok, "a dead job is not moved again")

	// Replayed and dead again: still one dead letter for the job.
	_, err = s.Replay(ctx, j.Key())
	require.NoError(t, err)
	c, err = s.Claim(ctx, j.Key(), "w3", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	dl.Reason = "dead again"
	ok, err = s.MarkDeadLettered(ctx, c.AttemptOf("w3"), attemptErr("server_error"), dl)
	require.NoError(t, err)
	require.True(t, ok)
	dls2 := deadLetters(t, s, "acme")
	require.Len(t, dls2, 1)
	assert.Equal(t, dls[0].ID, dls2[0].ID)
	assert.Equal(t, "dead again", dls2[0].Reason)

	// A failing dead letter rolls the move back.
	k := job.Key{Tenant: "acme", ID: "rollback"}
	c = insertClaimed(t, s, sampleJob(k.Tenant, k.ID), "w1", time.Minute)
	before := mustGet(t, s, k)
	bad := dl
	bad.JobID, bad.Reason = k.ID, "" // dead_letters_reason_valid refuses it
	_, err = s.MarkDeadLettered(ctx, c.AttemptOf("w1"), attemptErr("server_error"), bad)
	require.Error(t, err)
	assert.Equal(t, before, mustGet(t, s, k), "one transaction: the job stays running")
}
