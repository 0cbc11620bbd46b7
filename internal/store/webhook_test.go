package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// insertDelivery writes a pending delivery as the result relay does, due
// at due, and returns its id.
func insertDelivery(t testing.TB, pool *pgxpool.Pool, tenant, jobID, url string, due time.Time) int64 {
	t.Helper()
	var id int64
	err := pool.QueryRow(context.Background(), `
		INSERT INTO webhook_deliveries (event_id, tenant, job_id, url, payload, next_attempt_at)
		VALUES (gen_random_uuid(), $1, $2, $3, $4, $5) RETURNING id`,
		tenant, jobID, url, []byte(`{"type":"job.succeeded"}`), due).Scan(&id)
	require.NoError(t, err)
	return id
}

func TestWebhookClaimLeasesDueDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	now := time.Now()
	due := insertDelivery(t, pool, "acme", "j1", "https://hooks.example.com/a", now.Add(-time.Second))
	insertDelivery(t, pool, "acme", "j2", "https://hooks.example.com/a", now.Add(time.Hour))

	got, err := s.ClaimWebhookDeliveries(ctx, now, time.Minute, 10)
	require.NoError(t, err)
	require.Len(t, got, 1, "only the due delivery")
	d := got[0]
	assert.Equal(t, due, d.ID)
	assert.Equal(t, "acme", d.Tenant)
	assert.Equal(t, "j1", d.JobID)
	assert.JSONEq(t, `{"type":"job.succeeded"}`, string(d.Payload))
	assert.Len(t, d.EventID, 36)
	assert.WithinDuration(t, now.Add(time.Minute), d.Lease, time.Millisecond)

	again, err := s.ClaimWebhookDeliveries(ctx, now, time.Minute, 10)
	require.NoError(t, err)
	assert.Empty(t, again, "a leased delivery is not claimed again while its lease holds")

	// The lease runs out (the dispatcher died): another claim takes it, and
	// the first claim can no longer record anything.
	later := now.Add(2 * time.Minute)
	retaken, err := s.ClaimWebhookDeliveries(ctx, later, time.Minute, 10)
	require.NoError(t, err)
	require.Len(t, retaken, 1)
	assert.ErrorIs(t, s.MarkWebhookDelivered(ctx, d, 200, later), store.ErrLeaseLost)
	require.NoError(t, s.MarkWebhookDelivered(ctx, retaken[0], 204, later))
	assert.ErrorIs(t, s.MarkWebhookRetry(ctx, retaken[0], store.WebhookAttempt{Error: "x"}, later), store.ErrLeaseLost, "recorded once")
}

func TestWebhookClaimersShareWithoutOverlap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	now := time.Now()
	const n = 60
	for i := range n {
		insertDelivery(t, pool, "acme", fmt.Sprintf("j%d", i), "https://hooks.example.com/a", now.Add(-time.Second))
	}
	var (
		mu   sync.Mutex
		seen = map[int64]int{}
		wg   sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for {
				got, err := s.ClaimWebhookDeliveries(ctx, now, time.Minute, 7)
				if !assert.NoError(t, err) || len(got) == 0 {
					return
				}
				mu.Lock()
				for _, d := range got {
					seen[d.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	assert.Len(t, seen, n, "every due delivery claimed")
	for id, c := range seen {
		assert.Equal(t, 1, c, "delivery %d claimed %d times", id, c)
	}
}

func TestWebhookRetryDeadAndStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	now := time.Now()
	insertDelivery(t, pool, "acme", "j1", "https://hooks.example.com/a", now)
	claim := func() store.WebhookDelivery {
		t.Helper()
		got, err := s.ClaimWebhookDeliveries(ctx, now, time.Minute, 1)
		require.NoError(t, err)
		require.Len(t, got, 1)
		return got[0]
	}
	d := claim()
	next := now.Add(-time.Millisecond) // due again at once
	require.NoError(t, s.MarkWebhookRetry(ctx, d, store.WebhookAttempt{Status: 503, Error: "HTTP 503"}, next))

	key := job.Key{Tenant: "acme", ID: "j1"}
	states, err := s.WebhookStates(ctx, []job.Key{key, {Tenant: "acme", ID: "none"}, {Tenant: "globex", ID: "j1"}})
	require.NoError(t, err)
	require.Len(t, states, 1, "only jobs with a delivery")
	st := states[key]
	assert.Equal(t, "pending", st.Status)
	assert.Equal(t, 1, st.Attempts)
	assert.Equal(t, 503, st.LastStatus)
	assert.Equal(t, "HTTP 503", st.LastError)
	require.NotNil(t, st.NextAttemptAt)
	assert.WithinDuration(t, next, *st.NextAttemptAt, time.Millisecond)

	d = claim()
	assert.Equal(t, 1, d.Attempts)
	long := strings.Repeat("é", 2000) + "\x00"
	require.NoError(t, s.MarkWebhookDead(ctx, d, store.WebhookAttempt{Error: "dial: \x00refused" + long}))
	states, err = s.WebhookStates(ctx, []job.Key{key})
	require.NoError(t, err)
	st = states[key]
	assert.Equal(t, "dead", st.Status)
	assert.Equal(t, 2, st.Attempts)
	assert.Zero(t, st.LastStatus, "no answer received")
	assert.LessOrEqual(t, len(st.LastError), 512, "last_error is bounded")
	assert.True(t, strings.HasPrefix(st.LastError, "dial: \uFFFDrefused"), "NUL replaced as in every stored error text: %q", st.LastError[:20])
	assert.Nil(t, st.NextAttemptAt)
	n, err := s.PendingWebhooks(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)

	// A later delivery of the same job (another event) is the one shown.
	insertDelivery(t, pool, "acme", "j1", "https://hooks.example.com/b", now)
	states, err = s.WebhookStates(ctx, []job.Key{key})
	require.NoError(t, err)
	assert.Equal(t, "pending", states[key].Status)
	assert.Zero(t, states[key].Attempts)
}
