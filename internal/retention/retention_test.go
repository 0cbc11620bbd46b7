package retention_test

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/llmq/llmq/internal/retention"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) { leakcheck.Main(m, leakcheck.LateCleanup()...) }

const day = 24 * time.Hour

func policy() retention.Config {
	return retention.Config{
		Jobs: retention.Policy{job.StatusSucceeded: 7 * day, job.StatusFailed: 30 * day,
			job.StatusDead: 30 * day, job.StatusCancelled: 7 * day},
		Tenants:     map[string]retention.Policy{"gold": {job.StatusSucceeded: 90 * day}},
		Idempotency: 7 * day, Usage: 400 * day,
		Batch: 2, // several batches per kind
	}
}

type rig struct {
	t    *testing.T
	st   *store.Store
	pool *pgxpool.Pool
	now  time.Time
}

func newRig(t *testing.T) *rig {
	pool := testsvc.Postgres(t)
	return &rig{t: t, st: store.New(pool), pool: pool, now: time.Now().UTC().Truncate(time.Microsecond)}
}

func (r *rig) sweeper(cfg retention.Config, at time.Time) *retention.Sweeper {
	s, err := retention.New(cfg, r.st, func() time.Time { return at }, nil, prometheus.NewRegistry())
	require.NoError(r.t, err)
	return s
}

func sample(tenant, id string) job.Job {
	return job.Job{Tenant: tenant, ID: id, Model: "qwen-plus", Priority: job.PriorityNormal, MaxAttempts: 3,
		Request:  json.RawMessage(`{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}`),
		Metadata: json.RawMessage(`{"ticket": 4711}`)}
}

func (r *rig) submit(j job.Job) store.BatchInsert {
	r.t.Helper()
	res, err := r.st.InsertBatch(context.Background(), []job.Job{j})
	require.NoError(r.t, err)
	return res[0]
}

// finish moves a job to status, finished age ago (and created a minute
// before), by SQL.
func (r *rig) finish(tenant, id string, status job.Status, age time.Duration) {
	r.t.Helper()
	r.submit(sample(tenant, id))
	done := r.now.Add(-age)
	var response any
	if status == job.StatusSucceeded {
		response = `{"choices": []}`
	}
	_, err := r.pool.Exec(context.Background(), `UPDATE jobs SET status = $3, attempts = 1, model_used = 'qwen-plus',
		response = $4::jsonb, created_at = $5::timestamptz - interval '1 minute', started_at = $5::timestamptz - interval '1 minute', completed_at = $5
		WHERE tenant = $1 AND id = $2`, tenant, id, string(status), response, done)
	require.NoError(r.t, err)
	r.relayed(tenant, id)
}

// relayed deletes the job's result event, as the relay does once it sent it.
func (r *rig) relayed(tenant, id string) {
	r.t.Helper()
	r.exec(`DELETE FROM result_events WHERE tenant = $1 AND job_id = $2`, tenant, id)
}

func (r *rig) exec(sql string, args ...any) {
	r.t.Helper()
	_, err := r.pool.Exec(context.Background(), sql, args...)
	require.NoError(r.t, err)
}

func (r *rig) strings(sql string, args ...any) []string {
	r.t.Helper()
	rows, err := r.pool.Query(context.Background(), sql, args...)
	require.NoError(r.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(r.t, err)
	sort.Strings(out)
	return out
}

func (r *rig) deadLetter(tenant, id, kind string, age time.Duration) {
	r.exec(`INSERT INTO dead_letters (tenant, job_id, lane, reason, body, kind, created_at)
		VALUES ($1, NULLIF($2, ''), 'normal', 'test', '\x7b7d', $3, $4)`, tenant, id, kind, r.now.Add(-age))
}

func (r *rig) delivery(tenant, id string) {
	r.exec(`INSERT INTO webhook_deliveries (event_id, tenant, job_id, url, payload, next_attempt_at)
		VALUES (gen_random_uuid(), $1, $2, 'https://hooks.example.com/x', '\x7b7d', now())`, tenant, id)
}

func TestSweepDeletesExactlyTheExpired(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	// acme follows the global policy; gold keeps successes 90 days.
	for _, id := range []string{"s-old-1", "s-old-2", "s-old-3", "s-old-4", "s-old-5"} {
		r.finish("acme", id, job.StatusSucceeded, 8*day)
	}
	r.finish("acme", "s-new", job.StatusSucceeded, 6*day)
	r.finish("acme", "f-old", job.StatusFailed, 31*day)
	r.finish("acme", "f-mid", job.StatusFailed, 8*day)
	r.finish("acme", "d-old", job.StatusDead, 31*day)
	r.finish("acme", "c-old", job.StatusCancelled, 8*day)
	r.finish("acme", "c-new", job.StatusCancelled, 1*day)
	r.submit(sample("acme", "queued")) // never finished: never deleted
	r.exec(`UPDATE jobs SET created_at = $1 WHERE id = 'queued'`, r.now.Add(-100*day))
	r.finish("gold", "s-mid", job.StatusSucceeded, 8*day)
	r.finish("gold", "s-old", job.StatusSucceeded, 91*day)
	r.finish("gold", "f-old", job.StatusFailed, 31*day)

	r.deadLetter("acme", "d-old", store.DeadLetterJob, 31*day)
	r.deadLetter("acme", "f-mid", store.DeadLetterJob, 8*day)
	r.deadLetter("acme", "", store.DeadLetterMessage, 31*day)
	r.deadLetter("acme", "junk", store.DeadLetterMessage, 1*day)
	r.delivery("acme", "s-old-1")
	r.exec(`UPDATE webhook_deliveries SET status = 'delivered', next_attempt_at = NULL, delivered_at = now() WHERE job_id = 's-old-1'`)
	r.delivery("acme", "s-new")
	// A webhook still being delivered keeps its job past the retention (a
	// tenant's may be shorter than webhooks.retry_for).
	r.finish("acme", "s-old-hook", job.StatusSucceeded, 8*day)
	r.delivery("acme", "s-old-hook")
	// So does a result event the relay has not sent yet (a broker outage
	// longer than the retention): deleted, the job's event would be dropped.
	r.finish("acme", "s-old-event", job.StatusSucceeded, 8*day)
	r.exec(`INSERT INTO result_events (tenant, job_id, status, occurred_at) VALUES ('acme', 's-old-event', 'succeeded', $1)`,
		r.now.Add(-8*day))
	r.exec(`INSERT INTO usage_hours (bucket, tenant, model, shard, calls) VALUES
		(date_trunc('hour', $1::timestamptz - interval '401 days'), 'acme', 'm', 0, 1),
		(date_trunc('hour', $1::timestamptz - interval '1 day'), 'acme', 'm', 0, 1)`, r.now)
	r.exec(`INSERT INTO job_tombstones (tenant, id, status, hash, created_at, completed_at, deleted_at) VALUES
		('acme', 'stale', 'succeeded', '\x00', $1, $1, $2), ('acme', 'fresh', 'succeeded', '\x00', $1, $1, $3)`,
		r.now.Add(-30*day), r.now.Add(-8*day), r.now.Add(-1*day))

	// Batch records go after the longest retention (gold's 90 days), done
	// ones only.
	r.exec(`INSERT INTO batches (model, state, file_name, jobs, bytes, tokens, window_seconds, created_at, updated_at) VALUES
		('m', 'done', 'old-done', 1, 1, 1, 86400, $1, $1), ('m', 'done', 'mid-done', 1, 1, 1, 86400, $2, $2),
		('m', 'formed', 'old-open', 1, 1, 1, 86400, $1, $1)`, r.now.Add(-91*day), r.now.Add(-89*day))

	got, err := r.sweeper(policy(), r.now).Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, retention.Counts{"succeeded": 6, "failed": 2, "dead": 1, "cancelled": 1,
		"message_dead_letters": 1, "tombstones": 1, "usage": 1, "batches": 1}, got)
	require.Equal(t, []string{"mid-done", "old-open"}, r.strings(`SELECT file_name FROM batches`))

	require.Equal(t, []string{"acme/c-new", "acme/f-mid", "acme/queued", "acme/s-new", "acme/s-old-event", "acme/s-old-hook", "gold/s-mid"},
		r.strings(`SELECT tenant || '/' || id FROM jobs`))
	require.Equal(t, []string{
		"acme/c-old/cancelled", "acme/d-old/dead", "acme/f-old/failed", "acme/fresh/succeeded",
		"acme/s-old-1/succeeded", "acme/s-old-2/succeeded", "acme/s-old-3/succeeded", "acme/s-old-4/succeeded", "acme/s-old-5/succeeded",
		"gold/f-old/failed", "gold/s-old/succeeded",
	}, r.strings(`SELECT tenant || '/' || id || '/' || status FROM job_tombstones`))
	r.exec(`SELECT 1 FROM job_tombstones WHERE id = 's-old-1' AND deleted_at = $1`, r.now)
	require.Equal(t, []string{"f-mid/job", "junk/message"}, r.strings(`SELECT coalesce(job_id, '') || '/' || kind FROM dead_letters`))
	require.Equal(t, []string{"s-new", "s-old-hook"}, r.strings(`SELECT job_id FROM webhook_deliveries`))
	require.Len(t, r.strings(`SELECT bucket::text FROM usage_hours`), 1)

	_, err = r.st.Get(ctx, job.Key{Tenant: "acme", ID: "s-old-1"})
	require.ErrorIs(t, err, store.ErrNotFound, "an expired job reads as not found")

	again, err := r.sweeper(policy(), r.now).Sweep(ctx)
	require.NoError(t, err)
	for kind, n := range again {
		require.Zero(t, n, "a second sweep at the same time deletes nothing more (%s)", kind)
	}

	// Once its webhook is dead (or delivered), the job goes at the next
	// sweep, and so does the job whose event is sent.
	r.exec(`UPDATE webhook_deliveries SET status = 'dead', next_attempt_at = NULL WHERE job_id = 's-old-hook'`)
	r.relayed("acme", "s-old-event")
	last, err := r.sweeper(policy(), r.now).Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, last["succeeded"])
	require.Equal(t, []string{"s-new"}, r.strings(`SELECT job_id FROM webhook_deliveries`))
}

func TestResubmitOfExpiredJob(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	key := job.Key{Tenant: "acme", ID: "j1"}
	r.finish("acme", "j1", job.StatusSucceeded, 8*day)
	_, err := r.sweeper(policy(), r.now).Sweep(ctx)
	require.NoError(t, err)
	_, err = r.st.Get(ctx, key)
	require.True(t, errors.Is(err, store.ErrNotFound))

	// Inside the window, the same job (its JSON spelled otherwise) is a
	// duplicate that already succeeded: not stored, so not run again.
	same := sample("acme", "j1")
	same.Request = json.RawMessage(`{"max_tokens":16,"messages":[{"content":"hi","role":"user"}]}`)
	res := r.submit(same)
	require.False(t, res.Created)
	require.Equal(t, job.StatusSucceeded, res.Record.Status)
	require.Equal(t, "qwen-plus", res.Record.Model, "the same job: the record carries it")
	require.NotNil(t, res.Record.CompletedAt)
	require.WithinDuration(t, r.now.Add(-8*day), *res.Record.CompletedAt, time.Millisecond)
	_, err = r.st.Get(ctx, key)
	require.ErrorIs(t, err, store.ErrNotFound, "nothing was stored")

	// Another job reusing the id is answered with the key and status only,
	// which the ingester's content comparison reports as a conflict.
	other := sample("acme", "j1")
	other.Request = json.RawMessage(`{"messages": [{"role": "user", "content": "something else"}]}`)
	res = r.submit(other)
	require.False(t, res.Created)
	require.Equal(t, job.StatusSucceeded, res.Record.Status)
	require.Empty(t, res.Record.Model)

	// So is a job of another kind with the same fields: the hash does not
	// cover the kind, the tombstone keeps it.
	otherKind := sample("acme", "j1")
	otherKind.Kind = job.KindEmbeddings
	res = r.submit(otherKind)
	require.False(t, res.Created)
	require.Empty(t, res.Record.Model, "another kind is another job")
	require.Equal(t, []string{"chat"}, r.strings(`SELECT kind FROM job_tombstones WHERE id = 'j1'`))

	// A tombstone left before tombstones kept the kind matches by hash.
	r.exec(`UPDATE job_tombstones SET kind = NULL WHERE id = 'j1'`)
	res = r.submit(otherKind)
	require.Equal(t, "qwen-plus", res.Record.Model)
	r.exec(`UPDATE job_tombstones SET kind = 'chat' WHERE id = 'j1'`)

	// A batch mixing a live job, a new one and the expired one.
	r.submit(sample("acme", "live"))
	batch, err := r.st.InsertBatch(ctx, []job.Job{sample("acme", "live"), sample("acme", "new"), sample("acme", "j1")})
	require.NoError(t, err)
	require.Equal(t, []bool{false, true, false}, []bool{batch[0].Created, batch[1].Created, batch[2].Created})
	require.Equal(t, job.StatusQueued, batch[0].Record.Status)
	require.Equal(t, job.StatusSucceeded, batch[2].Record.Status)

	// Past the window the tombstone is swept and the id is free again.
	got, err := r.sweeper(policy(), r.now.Add(7*day+time.Second)).Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, got["tombstones"])
	res = r.submit(sample("acme", "j1"))
	require.True(t, res.Created, "after the idempotency window the id is a new job")
	require.Equal(t, job.StatusQueued, mustStatus(t, r.st, key))
}

func mustStatus(t *testing.T, st *store.Store, key job.Key) job.Status {
	rec, err := st.Get(context.Background(), key)
	require.NoError(t, err)
	return rec.Status
}

func TestOneActiveSweeper(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	lease, err := r.st.TryLead(ctx, store.RetentionLockID)
	require.NoError(t, err)
	require.NotNil(t, lease)
	defer lease.Release(ctx)
	second, err := r.st.TryLead(ctx, store.RetentionLockID)
	require.NoError(t, err)
	require.Nil(t, second, "a second replica does not sweep while one holds the lock")
}

// gauge reads llmq_retention_active from reg.
func gauge(t *testing.T, reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "llmq_retention_active" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

func TestRunOneActiveAmongReplicasAndStops(t *testing.T) {
	r := newRig(t)
	for _, id := range []string{"a", "b", "c"} {
		r.finish("acme", id, job.StatusSucceeded, 8*day)
	}
	cfg := policy()
	cfg.Interval = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	var regs []*prometheus.Registry
	done := make(chan error, 2)
	for range 2 {
		reg := prometheus.NewRegistry()
		regs = append(regs, reg)
		s, err := retention.New(cfg, r.st, func() time.Time { return r.now }, nil, reg)
		require.NoError(t, err)
		go func() { done <- s.Run(ctx) }()
	}
	require.Eventually(t, func() bool {
		return len(r.strings(`SELECT id FROM jobs`)) == 0 && gauge(t, regs[0])+gauge(t, regs[1]) == 1
	}, 10*time.Second, 10*time.Millisecond, "the expired jobs are deleted by exactly one active sweeper")
	cancel()
	for range 2 {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	}
	require.Len(t, r.strings(`SELECT id FROM job_tombstones`), 3)
}
