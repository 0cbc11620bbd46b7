package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
	"github.com/llmq/llmq/migrations"
)

func TestMigrateOnEmptyDatabaseThenNoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testsvc.PostgresEmpty(t)
	require.NoError(t, store.Migrate(ctx, pool))

	var tables []string
	rows, err := pool.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1`)
	require.NoError(t, err)
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Subset(t, tables, []string{"dead_letters", "jobs", store.MigrationsTable})

	versions := func() (n int, max int64) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), max(version_id) FROM `+store.MigrationsTable).Scan(&n, &max))
		return n, max
	}
	n1, v1 := versions()
	require.NoError(t, store.Migrate(ctx, pool), "re-run")
	n2, v2 := versions()
	assert.Equal(t, n1, n2, "a re-run applies nothing")
	assert.Equal(t, v1, v2)
	assert.Equal(t, migrationFiles(t), n1-1, "one row per migration besides goose's version 0")
	assert.Positive(t, v1)
}

func migrationFiles(t *testing.T) int {
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return len(files)
}

func TestMigrateConcurrentCallers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := testsvc.PostgresEmptyURL(t)
	// Separate pools stand in for separate processes.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	pools := make([]*pgxpool.Pool, len(errs))
	for i := range errs {
		pool, err := pgxpool.New(ctx, u)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		pools[i] = pool
	}
	start := make(chan struct{})
	for i, pool := range pools {
		wg.Go(func() {
			<-start
			errs[i] = store.Migrate(ctx, pool)
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var applied int
	require.NoError(t, pools[0].QueryRow(ctx, `SELECT count(*) FROM `+store.MigrationsTable+` WHERE version_id > 0`).Scan(&applied))
	assert.Equal(t, migrationFiles(t), applied, "each migration applied once")
}

func TestInsertIsIdempotentPerTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	first := mustInsert(t, s, sampleJob("acme", "job-1"))
	assert.Equal(t, job.StatusQueued, first.Status)
	assert.Equal(t, 0, first.Attempts)
	assert.Equal(t, []string{"qwen-flash"}, first.FallbackModels)
	assert.JSONEq(t, `{"ticket": 4711}`, string(first.Metadata))

	again := sampleJob("acme", "job-1")
	again.Model = "other-model"
	again.Request = json.RawMessage(`{"messages": [{"role": "user", "content": "changed"}]}`)
	rec, created, err := s.Insert(ctx, again)
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, first, rec, "re-insert returns the existing row unchanged")
	assert.Equal(t, first, mustGet(t, s, first.Key()))

	other := mustInsert(t, s, sampleJob("globex", "job-1"))
	assert.Equal(t, "globex", other.Tenant)
	_, err = s.Complete(ctx, store.Attempt{Key: first.Key(), Owner: "nobody", N: 1}, result())
	require.NoError(t, err)
	c, err := s.Claim(ctx, job.Key{Tenant: "acme", ID: "job-1"}, "w1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	assert.Equal(t, job.StatusQueued, mustGet(t, s, other.Key()).Status, "claiming acme's job leaves globex's alone")

	_, err = s.Get(ctx, job.Key{Tenant: "initech", ID: "job-1"})
	assert.ErrorIs(t, err, store.ErrNotFound)
}

func TestInsertNormalizesDefaults(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	j := sampleJob("", "plain")
	j.Priority, j.MaxAttempts, j.FallbackModels, j.Metadata = "", 0, nil, nil
	rec := mustInsert(t, s, j)
	assert.Equal(t, job.DefaultTenant, rec.Tenant)
	assert.Equal(t, job.PriorityNormal, rec.Priority)
	assert.Equal(t, job.DefaultMaxAttempts, rec.MaxAttempts)
	assert.Nil(t, rec.FallbackModels)
	assert.Nil(t, rec.Metadata)
}

func TestConcurrentClaimsHaveOneWinner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	single := mustInsert(t, s, sampleJob("acme", "contended"))
	batched := mustInsert(t, s, sampleJob("acme", "contended-batch"))

	for name, claim := range map[string]func(owner string) (store.Claim, error){
		"Claim": func(owner string) (store.Claim, error) { return s.Claim(ctx, single.Key(), owner, time.Minute) },
		"ClaimBatch": func(owner string) (store.Claim, error) {
			cs, err := s.ClaimBatch(ctx, []job.Key{batched.Key()}, owner, time.Minute)
			if err != nil {
				return store.Claim{}, err
			}
			if len(cs) != 1 {
				return store.Claim{}, fmt.Errorf("%d claims for one key", len(cs))
			}
			return cs[0], nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			claims := make([]store.Claim, 8)
			errs := make([]error, 8)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range claims {
				wg.Go(func() {
					<-start
					claims[i], errs[i] = claim("w" + string(rune('a'+i)))
				})
			}
			close(start)
			wg.Wait()
			won := 0
			for i, c := range claims {
				require.NoError(t, errs[i])
				switch c.Outcome {
				case store.Claimed:
					won++
					assert.Equal(t, 1, c.Attempt)
				case store.Busy:
					assert.Positive(t, c.RetryIn)
					assert.LessOrEqual(t, c.RetryIn, time.Minute)
				default:
					t.Errorf("claim %d: outcome %v", i, c.Outcome)
				}
			}
			assert.Equal(t, 1, won, "exactly one of 8 claims wins")
		})
	}
}

func TestClaimOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)

	_, err := s.Claim(ctx, job.Key{Tenant: "acme", ID: "missing"}, "w1", time.Minute)
	assert.ErrorIs(t, err, store.ErrNotFound)

	j := mustInsert(t, s, sampleJob("acme", "flow"))
	c, err := s.Claim(ctx, j.Key(), "w1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	assert.Equal(t, job.StatusRunning, c.Record.Status)
	assert.Equal(t, "w1", c.Record.LeaseOwner)
	require.NotNil(t, c.Record.StartedAt)

	// A retry scheduled in the future is not due.
	ok, err := s.ScheduleRetry(ctx, store.Attempt{Key: j.Key(), Owner: "w1", N: 1}, time.Now().Add(time.Hour), attemptErr("rate_limited"))
	require.NoError(t, err)
	require.True(t, ok)
	c, err = s.Claim(ctx, j.Key(), "w2", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, store.NotDue, c.Outcome)
	assert.Greater(t, c.RetryIn, 59*time.Minute)

	// Due now: claimable, attempt 2, next_attempt_at cleared.
	_, err = pool.Exec(ctx, `UPDATE jobs SET next_attempt_at = now() - interval '1 second' WHERE id = 'flow'`)
	require.NoError(t, err)
	c, err = s.Claim(ctx, j.Key(), "w2", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	assert.Equal(t, 2, c.Attempt)
	assert.Nil(t, c.Record.NextAttemptAt)
	require.Len(t, c.Record.Errors, 1)
	assert.Equal(t, 1, c.Record.Errors[0].Attempt)
	assert.Equal(t, "rate_limited", c.Record.Errors[0].Kind)

	// The result is written once.
	ok, err = s.Complete(ctx, store.Attempt{Key: j.Key(), Owner: "w1", N: 1}, result())
	require.NoError(t, err)
	assert.False(t, ok, "the old attempt cannot complete")
	ok, err = s.Complete(ctx, store.Attempt{Key: j.Key(), Owner: "w2", N: 2}, result())
	require.NoError(t, err)
	require.True(t, ok)
	second := result()
	second.Response = json.RawMessage(`{"other": 1}`)
	ok, err = s.Complete(ctx, store.Attempt{Key: j.Key(), Owner: "w2", N: 2}, second)
	require.NoError(t, err)
	assert.False(t, ok, "a second Complete changes nothing")
	rec := mustGet(t, s, j.Key())
	assert.Equal(t, job.StatusSucceeded, rec.Status)
	assert.JSONEq(t, `{"choices": []}`, string(rec.Response))
	assert.Equal(t, 10, rec.PromptTokens)
	assert.Equal(t, 5, rec.CompletionTokens)
	assert.Empty(t, rec.LeaseOwner)
	require.NotNil(t, rec.CompletedAt)

	c, err = s.Claim(ctx, j.Key(), "w3", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, store.AlreadyFinished, c.Outcome)

	k := job.Key{Tenant: "acme", ID: "to-cancel"}
	mustInsert(t, s, sampleJob(k.Tenant, k.ID))
	_, err = s.Cancel(ctx, k)
	require.NoError(t, err)
	c, err = s.Claim(ctx, k, "w3", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, store.Cancelled, c.Outcome)
}

func TestStaleLeaseTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	j := sampleJob("acme", "stale")
	j.MaxAttempts = 2
	c := insertClaimed(t, s, j, "w1", time.Minute)
	require.Equal(t, 1, c.Attempt)

	c, err := s.Claim(ctx, j.Key(), "w2", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Busy, c.Outcome, "a live lease is not taken over")

	expireLease(t, pool, j.Key())
	c, err = s.Claim(ctx, j.Key(), "w2", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome, "a stale lease is taken over")
	assert.Equal(t, 2, c.Attempt)
	assert.Equal(t, "w2", c.Record.LeaseOwner)

	n, err := s.Heartbeat(ctx, "w1", []job.Key{j.Key()}, time.Hour)
	require.NoError(t, err)
	assert.Zero(t, n, "the old owner's heartbeat extends nothing")
	ok, err := s.Complete(ctx, store.Attempt{Key: j.Key(), Owner: "w1", N: 1}, result())
	require.NoError(t, err)
	assert.False(t, ok, "the old owner's result is refused")

	// The last attempt's lease expires too: no attempt is left, so the claim
	// moves the job to dead.
	expireLease(t, pool, j.Key())
	c, err = s.Claim(ctx, j.Key(), "w3", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Exhausted, c.Outcome)
	assert.Equal(t, job.StatusDead, c.Record.Status)
	require.Len(t, c.Record.Errors, 1)
	assert.Equal(t, "exhausted", c.Record.Errors[0].Kind)
	assert.Equal(t, 2, c.Record.Errors[0].Attempt)
	// Its dead letter is written with the move to dead: a caller that dies
	// before writing one would leave a dead job that no DLQ lists, and the
	// next delivery would find it finished.
	dls := deadLetters(t, s, j.Tenant)
	require.Len(t, dls, 1, "the dead job is in the DLQ")
	assert.Equal(t, j.ID, dls[0].JobID)
	assert.Equal(t, store.ReasonExhausted, dls[0].Reason)
	assert.Equal(t, 2, dls[0].Attempts)
	assert.Contains(t, dls[0].LastError, "lease of attempt 2 expired")
	var body job.Job
	require.NoError(t, json.Unmarshal(dls[0].Body, &body))
	assert.Equal(t, j.ID, body.ID, "the job is the dead letter's body")
	c, err = s.Claim(ctx, j.Key(), "w4", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, store.AlreadyFinished, c.Outcome)
	assert.Len(t, deadLetters(t, s, j.Tenant), 1, "one dead letter")
}

func TestHeartbeatAndRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	var keys []job.Key
	for _, id := range []string{"h1", "h2", "h3"} {
		c := insertClaimed(t, s, sampleJob("acme", id), "w1", time.Second)
		keys = append(keys, c.Record.Key())
	}
	before := mustGet(t, s, keys[0]).LeaseExpiresAt
	n, err := s.Heartbeat(ctx, "w1", append(keys, job.Key{Tenant: "acme", ID: "unknown"}), time.Hour)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	after := mustGet(t, s, keys[0]).LeaseExpiresAt
	assert.True(t, after.After(before.Add(50*time.Minute)), "lease extended to about an hour")

	ok, err := s.Release(ctx, keys[0], "w2")
	require.NoError(t, err)
	assert.False(t, ok, "another owner cannot release")
	ok, err = s.Release(ctx, keys[0], "w1")
	require.NoError(t, err)
	require.True(t, ok)
	rec := mustGet(t, s, keys[0])
	assert.Equal(t, job.StatusQueued, rec.Status)
	assert.Equal(t, 0, rec.Attempts, "a handed-back attempt does not count")
	assert.Empty(t, rec.LeaseOwner)
	c, err := s.Claim(ctx, keys[0], "w2", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, 1, c.Attempt)
}

func TestFailMarkDeadCancelReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)

	c := insertClaimed(t, s, sampleJob("acme", "fails"), "w1", time.Minute)
	ok, err := s.Fail(ctx, c.AttemptOf("w1"), attemptErr("invalid_request"))
	require.NoError(t, err)
	require.True(t, ok)
	rec := mustGet(t, s, c.Record.Key())
	assert.Equal(t, job.StatusFailed, rec.Status)
	require.Len(t, rec.Errors, 1)
	assert.Equal(t, "invalid_request happened", rec.Errors[0].Message)

	replayed, err := s.Replay(ctx, rec.Key())
	require.NoError(t, err)
	assert.Equal(t, job.StatusQueued, replayed.Status)
	assert.Equal(t, 0, replayed.Attempts)
	assert.Equal(t, rec.MaxAttempts, replayed.MaxAttempts)
	assert.Len(t, replayed.Errors, 1, "history kept")
	assert.Nil(t, replayed.CompletedAt)
	assert.Nil(t, replayed.StartedAt)
	assert.Nil(t, replayed.EnqueuedAt, "no message exists for a replayed job yet")
	assert.Equal(t, replayed, mustGet(t, s, rec.Key()))

	// Claimed again and found past its deadline: the attempt ends dead.
	c, err = s.Claim(ctx, rec.Key(), "w1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	ok, err = s.MarkDead(ctx, c.AttemptOf("w1"), attemptErr("deadline"))
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, job.StatusDead, mustGet(t, s, rec.Key()).Status)

	_, err = s.Cancel(ctx, rec.Key())
	var te *job.TransitionError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, job.StatusDead, te.From)
	assert.Equal(t, job.StatusCancelled, te.To)
	_, err = s.Cancel(ctx, job.Key{Tenant: "acme", ID: "nope"})
	assert.ErrorIs(t, err, store.ErrNotFound)
	_, err = s.Replay(ctx, job.Key{Tenant: "other", ID: "fails"})
	assert.ErrorIs(t, err, store.ErrNotFound, "another tenant's job is not found")

	q := mustInsert(t, s, sampleJob("acme", "queued"))
	_, err = s.Replay(ctx, q.Key())
	require.ErrorAs(t, err, &te)
	assert.Equal(t, job.StatusQueued, te.From)
	cancelled, err := s.Cancel(ctx, q.Key())
	require.NoError(t, err)
	assert.Equal(t, job.StatusCancelled, cancelled.Status)
	require.NotNil(t, cancelled.CompletedAt)
}

func TestBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	for i, st := range job.Statuses {
		for _, p := range []job.Priority{job.PriorityHigh, job.PriorityLow} {
			j := sampleJob("acme", string(p)+"-"+string(st))
			j.Priority = p
			mustInsert(t, s, j)
			forceStatus(t, pool, j.Key(), job.Statuses[i])
		}
	}
	got, err := s.Backlog(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[job.Priority]int64{job.PriorityHigh: 3, job.PriorityNormal: 0, job.PriorityLow: 3}, got)
}

// TestCheckConstraintsRejectInconsistentRows writes rows by raw SQL that
// contradict their status: the database refuses each.
func TestCheckConstraintsRejectInconsistentRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := newStore(t)
	const cols = `INSERT INTO jobs (tenant, id, model, request, status, attempts, max_attempts, lease_owner,
		lease_expires_at, started_at, completed_at, next_attempt_at, response, model_used, priority, errors) VALUES `
	cases := map[string]string{
		"unknown status":                 `('t','a','m','{}','paused',0,5,NULL,NULL,NULL,NULL,NULL,NULL,NULL,'normal','[]')`,
		"unknown priority":               `('t','a','m','{}','queued',0,5,NULL,NULL,NULL,NULL,NULL,NULL,NULL,'urgent','[]')`,
		"queued with completed_at":       `('t','a','m','{}','queued',0,5,NULL,NULL,NULL,now(),NULL,NULL,NULL,'normal','[]')`,
		"queued with a lease":            `('t','a','m','{}','queued',0,5,'w',now(),NULL,NULL,NULL,NULL,NULL,'normal','[]')`,
		"running without lease":          `('t','a','m','{}','running',1,5,NULL,NULL,now(),NULL,NULL,NULL,NULL,'normal','[]')`,
		"running without started_at":     `('t','a','m','{}','running',1,5,'w',now(),NULL,NULL,NULL,NULL,NULL,'normal','[]')`,
		"running with attempts 0":        `('t','a','m','{}','running',0,5,'w',now(),now(),NULL,NULL,NULL,NULL,'normal','[]')`,
		"retrying without next attempt":  `('t','a','m','{}','retrying',1,5,NULL,NULL,now(),NULL,NULL,NULL,NULL,'normal','[]')`,
		"succeeded without response":     `('t','a','m','{}','succeeded',1,5,NULL,NULL,now(),now(),NULL,NULL,'m','normal','[]')`,
		"succeeded without completed_at": `('t','a','m','{}','succeeded',1,5,NULL,NULL,now(),NULL,NULL,'{}','m','normal','[]')`,
		"failed with a response":         `('t','a','m','{}','failed',1,5,NULL,NULL,now(),now(),NULL,'{}','m','normal','[]')`,
		"dead without completed_at":      `('t','a','m','{}','dead',1,5,NULL,NULL,now(),NULL,NULL,NULL,NULL,'normal','[]')`,
		"cancelled holding a lease":      `('t','a','m','{}','cancelled',1,5,'w',now(),now(),now(),NULL,NULL,NULL,'normal','[]')`,
		"attempts over max":              `('t','a','m','{}','failed',6,5,NULL,NULL,now(),now(),NULL,NULL,NULL,'normal','[]')`,
		"max_attempts 0":                 `('t','a','m','{}','queued',0,0,NULL,NULL,NULL,NULL,NULL,NULL,NULL,'normal','[]')`,
		"request not an object":          `('t','a','m','[]','queued',0,5,NULL,NULL,NULL,NULL,NULL,NULL,NULL,'normal','[]')`,
		"errors not an array":            `('t','a','m','{}','queued',0,5,NULL,NULL,NULL,NULL,NULL,NULL,NULL,'normal','{}')`,
		"empty id":                       `('t','','m','{}','queued',0,5,NULL,NULL,NULL,NULL,NULL,NULL,NULL,'normal','[]')`,
	}
	for name, values := range cases {
		_, err := pool.Exec(ctx, cols+values)
		var pgErr *pgconn.PgError
		if assert.ErrorAs(t, err, &pgErr, name) {
			assert.Equal(t, "23514", pgErr.Code, "%s: want check_violation, got %v", name, err)
		}
	}
	_, err := pool.Exec(ctx, cols+`('t','a','m','{}','queued',0,5,NULL,NULL,NULL,NULL,NULL,NULL,NULL,'normal','[]')`)
	require.NoError(t, err, "a consistent row is accepted")
}
