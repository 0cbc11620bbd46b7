package webhook_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
	"github.com/llmq/llmq/internal/webhook"
)

const (
	testSecret  = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	otherSecret = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// receiver is a webhook endpoint on an httptest server that verifies every
// request with client.VerifyWebhook and answers what answer says.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	hits   map[string]int // by webhook-id, every request
	good   map[string][]byte
	bad    int // requests whose signature did not verify
	answer func(r *http.Request) int
}

func newReceiver(t *testing.T, secret string, now func() time.Time, answer func(*http.Request) int) *receiver {
	t.Helper()
	rc := &receiver{hits: map[string]int{}, good: map[string][]byte{}, answer: answer}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("webhook-id")
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.hits[id]++
		if err := client.VerifyWebhook(secret, r.Header, body, now()); err != nil {
			rc.bad++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		code := rc.answer(r)
		if code/100 == 2 {
			rc.good[id] = body
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) snapshot() (hits map[string]int, good map[string][]byte, bad int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	hits, good = map[string]int{}, map[string][]byte{}
	for k, v := range rc.hits {
		hits[k] = v
	}
	for k, v := range rc.good {
		good[k] = v
	}
	return hits, good, rc.bad
}

// running is a Dispatcher running over a fresh database, and the attempts
// it records.
type running struct {
	d        *webhook.Dispatcher
	pool     *pgxpool.Pool
	store    *store.Store
	attempts chan webhook.Attempt
}

func startDispatcher(t *testing.T, pool *pgxpool.Pool, p webhook.Params) *running {
	t.Helper()
	r := &running{pool: pool, store: store.New(pool), attempts: make(chan webhook.Attempt, 1024)}
	p.Store = r.store
	if p.Tenants == nil {
		p.Tenants = map[string]config.Tenant{"acme": {WebhookSecret: testSecret}}
	}
	p.OnAttempt = func(a webhook.Attempt) { r.attempts <- a }
	d, err := webhook.New(p)
	require.NoError(t, err)
	r.d = d
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r
}

// next waits for the next recorded attempt.
func (r *running) next(t *testing.T) webhook.Attempt {
	t.Helper()
	select {
	case a := <-r.attempts:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no webhook attempt within 20s")
		return webhook.Attempt{}
	}
}

// insertDelivery writes a pending delivery as the result relay does and
// returns its id and event id.
func insertDelivery(t *testing.T, pool *pgxpool.Pool, tenant, jobID, url string, payload []byte, due time.Time) (int64, string) {
	t.Helper()
	var (
		id      int64
		eventID string
	)
	err := pool.QueryRow(context.Background(), `
		INSERT INTO webhook_deliveries (event_id, tenant, job_id, url, payload, next_attempt_at)
		VALUES (gen_random_uuid(), $1, $2, $3, $4, $5) RETURNING id, event_id::text`,
		tenant, jobID, url, payload, due).Scan(&id, &eventID)
	require.NoError(t, err)
	return id, eventID
}

// deliveryRow is a webhook_deliveries row as the test reads it back.
type deliveryRow struct {
	Status     string
	Attempts   int
	LastError  *string
	LastStatus *int32
	Delivered  *time.Time
}

func readDelivery(t *testing.T, pool *pgxpool.Pool, id int64) deliveryRow {
	t.Helper()
	var d deliveryRow
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT status, attempts, last_error, last_status, delivered_at FROM webhook_deliveries WHERE id = $1`, id).
		Scan(&d.Status, &d.Attempts, &d.LastError, &d.LastStatus, &d.Delivered))
	return d
}

// drive moves clock from one due time to the next, each time waking the
// dispatcher and waiting for every attempt due, until no delivery is
// pending. It returns how many steps it took.
func drive(t *testing.T, r *running, clock *fakeClock, maxSteps int) int {
	t.Helper()
	ctx := context.Background()
	for step := 0; step < maxSteps; step++ {
		var next *time.Time
		require.NoError(t, r.pool.QueryRow(ctx, `SELECT min(next_attempt_at) FROM webhook_deliveries WHERE status = 'pending'`).Scan(&next))
		if next == nil {
			return step
		}
		target := clock.Now()
		if next.After(target) {
			target = *next
		}
		// Counted before the clock moves: until it does, nothing is due
		// and the dispatcher can claim nothing.
		var due int
		require.NoError(t, r.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries
			WHERE status = 'pending' AND next_attempt_at <= $1`, target).Scan(&due))
		require.Positive(t, due)
		clock.Set(target)
		r.d.Kick()
		for range due {
			r.next(t)
		}
	}
	t.Fatalf("deliveries still pending after %d steps", maxSteps)
	return maxSteps
}

func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return testsvc.Postgres(t)
}
