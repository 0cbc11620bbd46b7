package worker

import (
	"context"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// Postgres stops answering for three seconds while jobs run: the worker's
// store calls fail at their deadline, it hands the deliveries back, and
// once Postgres answers again every job succeeds, none is lost.
func TestPostgresStopsAnsweringLosesNothing(t *testing.T) {
	t.Parallel()
	models := map[string]config.Model{"qwen-plus": {}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"qwen-plus": {}}}, models)
	u, err := url.Parse(h.pool.Config().ConnConfig.ConnString())
	require.NoError(t, err)
	proxy := testsvc.NewProxy(t, fmt.Sprintf("%s:%d", h.pool.Config().ConnConfig.Host, h.pool.Config().ConnConfig.Port))
	u.Host = proxy.Addr()
	pool, err := pgxpool.New(context.Background(), u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	h.ns = &notifyStore{Store: store.New(pool).WithTimeout(time.Second), events: make(chan string, 1<<16)}
	counting := &failCountingStore{notifyStore: h.ns}

	mem := memory.New(memory.Config{})
	var bodies [][]byte
	for i := range 3000 {
		bodies = append(bodies, jobBody(fmt.Sprintf("wedge-%d", i), "qwen-plus", i, nil))
	}
	h.submitMany(mem.Publisher(), bodies)
	cfg := h.cfg
	cfg.Lease = 2 * time.Second
	w, err := New(cfg, Deps{Store: counting, Subscriber: mem.Subscriber(), Provider: h.call,
		Governor: GovernorFactory(models, "auto"), Logger: testLogger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })

	// Wedge Postgres once work is under way, for three seconds (the store
	// deadline is one: a loaded CI machine needs the margin before it).
	require.Eventually(t, func() bool { return len(h.ns.events) >= 20 }, 30*time.Second, 5*time.Millisecond)
	proxy.Wedge(true)
	time.Sleep(3 * time.Second)
	proxy.Wedge(false)

	require.Eventually(t, func() bool {
		var done int
		require.NoError(t, h.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE status = 'succeeded'`).Scan(&done))
		return done == len(bodies)
	}, 90*time.Second, 100*time.Millisecond, "every job must succeed once Postgres answers again")
	var other int
	require.NoError(t, h.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE status <> 'succeeded'`).Scan(&other))
	require.Zero(t, other)
	require.Positive(t, counting.failed.Load(), "the wedge must have failed store calls at their deadline")
}

// failCountingStore counts the claim and completion calls that failed.
type failCountingStore struct {
	*notifyStore
	failed atomic.Int64
}

func (s *failCountingStore) ClaimBatch(ctx context.Context, keys []job.Key, owner string, lease time.Duration) ([]store.Claim, error) {
	c, err := s.notifyStore.ClaimBatch(ctx, keys, owner, lease)
	if err != nil {
		s.failed.Add(1)
	}
	return c, err
}

func (s *failCountingStore) CompleteBatch(ctx context.Context, items []store.Completion) ([]bool, error) {
	ok, err := s.notifyStore.CompleteBatch(ctx, items)
	if err != nil {
		s.failed.Add(1)
	}
	return ok, err
}
