package store_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
	"github.com/llmq/llmq/migrations"
)

// migrateTo applies llmq's migrations up to version with goose, the way
// store.Migrate does (same version table), for tests of a later
// migration on data written under an earlier schema. store.Migrate has no
// target version of its own.
func migrateTo(t *testing.T, pool *pgxpool.Pool, version int64) {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(store.MigrationsTable), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = p.UpTo(context.Background(), version)
	require.NoError(t, err)
	v, err := p.GetDBVersion(context.Background())
	require.NoError(t, err)
	require.Equal(t, version, v)
}

// Migration 00003 (one record) applies on a database at 00002 that holds
// data: unfinished jobs get enqueued_at (their message exists), finished
// ones do not; a dead letter that names no job row becomes kind message,
// one of a job row stays kind job.
func TestMigration00003OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testsvc.PostgresEmpty(t)
	migrateTo(t, pool, 2)

	_, err := pool.Exec(ctx, `
		INSERT INTO jobs (tenant, id, model, request, updated_at) VALUES
			('acme', 'queued', 'qwen-plus', '{"messages": []}', now() - interval '1 minute');
		INSERT INTO jobs (tenant, id, model, request, status, attempts, lease_owner, lease_expires_at, started_at) VALUES
			('acme', 'running', 'qwen-plus', '{}', 'running', 1, 'w1', now() + interval '1 minute', now());
		INSERT INTO jobs (tenant, id, model, request, status, attempts, started_at, next_attempt_at) VALUES
			('acme', 'retrying', 'qwen-plus', '{}', 'retrying', 1, now(), now() + interval '1 minute');
		INSERT INTO jobs (tenant, id, model, request, status, attempts, started_at, completed_at) VALUES
			('acme', 'dead', 'qwen-plus', '{}', 'dead', 1, now(), now());
		INSERT INTO dead_letters (tenant, job_id, lane, reason, body) VALUES
			('acme', 'orphan', 'normal', 'malformed: request is not an object', '{"id": "orphan", "request": 1}'),
			('default', NULL, 'normal', 'malformed: not JSON', '{oops'),
			('acme', 'dead', 'normal', 'attempts exhausted', '{"id": "dead"}');`)
	require.NoError(t, err)
	var queuedUpdatedAt time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT updated_at FROM jobs WHERE id = 'queued'`).Scan(&queuedUpdatedAt))

	require.NoError(t, store.Migrate(ctx, pool))
	s := store.New(pool)

	for _, tc := range []struct {
		id       string
		enqueued bool
	}{{"queued", true}, {"running", true}, {"retrying", true}, {"dead", false}} {
		rec := mustGet(t, s, job.Key{Tenant: "acme", ID: tc.id})
		assert.Equal(t, tc.enqueued, rec.EnqueuedAt != nil, "%s: enqueued_at set iff the job is unfinished", tc.id)
	}
	queued := mustGet(t, s, job.Key{Tenant: "acme", ID: "queued"})
	require.NotNil(t, queued.EnqueuedAt)
	assert.True(t, queuedUpdatedAt.Equal(*queued.EnqueuedAt), "enqueued_at is the row's last update")

	kinds := map[string]string{}
	for _, tenant := range []string{"acme", job.DefaultTenant} {
		for _, d := range deadLetters(t, s, tenant) {
			kinds[tenant+"/"+d.JobID] = d.Kind
		}
	}
	assert.Equal(t, map[string]string{
		"acme/orphan": store.DeadLetterMessage, // a job_id but no row
		"default/":    store.DeadLetterMessage, // no job_id
		"acme/dead":   store.DeadLetterJob,
	}, kinds)

	// The migrated database works under the new rules: the orphan's id is
	// free for a job of its own, whose dead letter is kind job next to the
	// message; the stored queued job is claimable and runs as stored.
	out, err := s.RecordIntakeFailure(ctx, store.IntakeFailure{Tenant: "acme", ID: "orphan", Reason: "still malformed",
		Body: []byte(`{"id": "orphan", "request": 2}`)})
	require.NoError(t, err)
	assert.Equal(t, store.IntakeJobFailed, out)
	c, err := s.Claim(ctx, queued.Key(), "w1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	assert.JSONEq(t, `{"messages": []}`, string(c.Record.Request))

	var applied int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+store.MigrationsTable+` WHERE version_id > 0`).Scan(&applied))
	assert.Equal(t, migrationFiles(t), applied, "Migrate applied the rest, once each")
}

// TestJobBodiesCompressWithLZ4: on a server with lz4 (this one), a
// response large enough to be compressed is compressed with lz4
// (migration 00038).
func TestJobBodiesCompressWithLZ4(t *testing.T) {
	ctx := context.Background()
	s, pool := newStore(t)
	j := sampleJob("acme", "long-answer")
	c := insertClaimed(t, s, j, "w1", time.Minute)
	answer := strings.Repeat("The ticket concerns a billing error; the customer was charged twice and asks for a refund. ", 40)
	r := result()
	r.Response = json.RawMessage(`{"choices":[{"message":{"role":"assistant","content":"` + answer + `"}}]}`)
	ok, err := s.Complete(ctx, c.AttemptOf("w1"), r)
	require.NoError(t, err)
	require.True(t, ok)
	var method *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_column_compression(response) FROM jobs WHERE tenant = 'acme' AND id = 'long-answer'`).Scan(&method))
	require.NotNil(t, method, "a %d-byte response is stored compressed", len(r.Response))
	require.Equal(t, "lz4", *method)
}
