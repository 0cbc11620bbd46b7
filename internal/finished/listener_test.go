package finished_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/finished"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) { leakcheck.Main(m, leakcheck.LateCleanup()...) }

const signalWait = 10 * time.Second

// start runs a listener on a fresh database until the test ends and
// returns it with a pool on the same database and a count of connects.
func start(t *testing.T, now func() time.Time) (*finished.Listener, *pgxpool.Pool, *atomic.Int32) {
	t.Helper()
	url := testsvc.PostgresURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var connects atomic.Int32
	l, err := finished.New(finished.Config{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			connects.Add(1)
			return pgx.Connect(ctx, url)
		},
		Now: now, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-l.Listening():
	case <-time.After(signalWait):
		t.Fatal("the listener did not connect")
	}
	return l, pool, &connects
}

func notify(t *testing.T, pool *pgxpool.Pool, payload string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), "SELECT pg_notify($1, $2)", finished.Channel, payload)
	require.NoError(t, err)
}

func woken(t *testing.T, w *finished.Waiter, what string) {
	t.Helper()
	select {
	case <-w.C:
	case <-time.After(signalWait):
		t.Fatalf("%s: not woken", what)
	}
}

// drained reports whether w has a wake pending.
func drained(w *finished.Waiter) bool {
	select {
	case <-w.C:
		return false
	default:
		return true
	}
}

// TestWakesTheWaitersOfTheKey: a finish wakes every waiter of its job and
// no other; a stopped waiter is gone.
func TestWakesTheWaitersOfTheKey(t *testing.T) {
	t.Parallel()
	l, pool, _ := start(t, nil)
	a1 := l.Register(job.Key{Tenant: "acme", ID: "a"})
	a2 := l.Register(job.Key{Tenant: "acme", ID: "a"})
	other := l.Register(job.Key{Tenant: "globex", ID: "a"})
	b := l.Register(job.Key{Tenant: "acme", ID: "b"})
	require.Equal(t, 4, l.Waiting())

	b.Stop()
	b.Stop() // again: nothing
	require.Equal(t, 3, l.Waiting())
	notify(t, pool, "normal acme a")
	woken(t, a1, "first waiter of acme/a")
	woken(t, a2, "second waiter of acme/a")
	// A marker on another key, sent after, shows the first was handled.
	marker := l.Register(job.Key{Tenant: "acme", ID: "marker"})
	notify(t, pool, "normal acme marker")
	woken(t, marker, "marker")
	assert.True(t, drained(other), "globex/a is another tenant's job")
	assert.True(t, drained(b), "a stopped waiter")
	for _, w := range []*finished.Waiter{a1, a2, other, marker} {
		w.Stop()
	}
	assert.Equal(t, 0, l.Waiting())
}

// TestReconnectWakesEveryWaiter: when the listening connection is killed
// the listener reconnects and wakes every waiter, which re-reads its row
// since a finish may have been announced while nobody listened; it then
// hears announcements again.
func TestReconnectWakesEveryWaiter(t *testing.T) {
	t.Parallel()
	l, pool, connects := start(t, nil)
	w := l.Register(job.Key{Tenant: "acme", ID: "a"})
	defer w.Stop()
	require.True(t, drained(w))
	var killed int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND query = 'LISTEN `+finished.Channel+`'`).Scan(&killed))
	require.Equal(t, 1, killed, "one listening backend")
	woken(t, w, "waiter after the reconnect")
	assert.Equal(t, int32(2), connects.Load())
	<-l.Listening()
	notify(t, pool, "high acme a")
	woken(t, w, "waiter after a finish on the new connection")
}

// TestDrainRate counts the finishes heard per lane over the last minute.
func TestDrainRate(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	clock := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	l, pool, _ := start(t, now)
	assert.Zero(t, l.DrainRate(job.PriorityHigh))

	advance(2 * time.Minute) // the listener has run longer than the window
	marker := l.Register(job.Key{Tenant: "t", ID: "marker"})
	defer marker.Stop()
	for range 30 {
		notify(t, pool, "high t x")
	}
	notify(t, pool, "low t y")
	notify(t, pool, "high t marker")
	woken(t, marker, "marker")
	assert.InDelta(t, 31.0/60, l.DrainRate(job.PriorityHigh), 1e-9)
	assert.InDelta(t, 1.0/60, l.DrainRate(job.PriorityLow), 1e-9)
	assert.Zero(t, l.DrainRate(job.PriorityNormal))

	advance(59 * time.Second)
	assert.InDelta(t, 31.0/60, l.DrainRate(job.PriorityHigh), 1e-9, "still within the minute")
	advance(time.Second)
	assert.Zero(t, l.DrainRate(job.PriorityHigh), "a minute later")
}

// TestTenantDrainRate counts the finishes heard per tenant, every lane
// together, over the last minute.
func TestTenantDrainRate(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	clock := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	l, pool, _ := start(t, now)
	advance(2 * time.Minute)
	marker := l.Register(job.Key{Tenant: "b", ID: "marker"})
	defer marker.Stop()
	for range 20 {
		notify(t, pool, "high a x")
	}
	notify(t, pool, "low a y\nnormal b z")
	notify(t, pool, "normal b marker")
	woken(t, marker, "marker")
	assert.InDelta(t, 21.0/60, l.TenantDrainRate("a"), 1e-9)
	assert.InDelta(t, 2.0/60, l.TenantDrainRate("b"), 1e-9)
	assert.Zero(t, l.TenantDrainRate("c"))
	assert.Equal(t, map[string]float64{"a": 21.0 / 60, "b": 2.0 / 60}, l.TenantDrainRates())

	advance(time.Minute)
	assert.Zero(t, l.TenantDrainRate("a"), "a minute later")
	assert.Empty(t, l.TenantDrainRates())
}
