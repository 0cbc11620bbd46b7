package worker

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/sim"
)

// parkedRig is a worker with nothing on its lanes and n parked jobs of one
// group in Postgres: everything it runs, its unparker brought back.
func parkedRig(t *testing.T, n int, wrap func(Provider) Provider, pgOpts ...func(*pgxpool.Config)) *harness {
	t.Helper()
	models := map[string]config.Model{"m": {Strategy: "ratelimit", MaxConcurrency: 64}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"m": {}}}, models, pgOpts...)
	if wrap != nil {
		h.call = wrap(h.call)
	}
	ctx := context.Background()
	jobs := make([]job.Job, n)
	keys := make([]job.Key, n)
	for i := range jobs {
		jobs[i] = job.Job{ID: fmt.Sprintf("p-%03d", i), Tenant: "flood", Model: "m", Priority: job.PriorityNormal,
			Request: []byte(fmt.Sprintf(`{"messages":[{"role":"user","content":"ticket %d"}],"max_tokens":8}`, i))}
		jobs[i].Normalize()
		keys[i] = jobs[i].Key()
	}
	_, err := h.store.InsertBatch(ctx, jobs)
	require.NoError(t, err)
	parked, err := h.store.Park(ctx, keys)
	require.NoError(t, err)
	for i := range parked {
		require.True(t, parked[i])
	}
	return h
}

// startParked starts h's worker on an empty memory broker with a hold of
// 16 jobs.
func startParked(h *harness, tune func(*Config)) (*Worker, func()) {
	mem := memory.New(memory.Config{})
	h.lanes = mem.Publisher()
	cfg := h.cfg
	cfg.TenantHold = 16
	if tune != nil {
		tune(&cfg)
	}
	return h.start(mem.Subscriber(), cfg)
}

// rowsWhere counts the jobs rows matching where.
func rowsWhere(t *testing.T, h *harness, where string) int {
	t.Helper()
	var n int
	require.NoError(t, h.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE `+where).Scan(&n))
	return n
}

// Parked jobs whose calls are quick are locked, run, and written once,
// finished: one attempt, one log entry, one outbox row and one call in
// usage each, and nothing left parked.
func TestParkedBatchWrittenOnce(t *testing.T) {
	t.Parallel()
	const n = 300
	h := parkedRig(t, n, nil)
	_, stop := startParked(h, nil)
	defer stop()
	assert.Equal(t, map[string]int{"succeeded": n}, h.wait(n, time.Minute))

	assert.Equal(t, n, rowsWhere(t, h, `status = 'succeeded' AND attempts = 1 AND parked_at IS NULL AND lease_owner IS NULL
		AND jsonb_array_length(attempt_log) = 1 AND finished_xid IS NOT NULL AND started_at IS NOT NULL`))
	var events, calls int
	ctx := context.Background()
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*) FROM result_events WHERE tenant = 'flood'`).Scan(&events))
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM usage_hours WHERE tenant = 'flood'`).Scan(&calls))
	assert.Equal(t, n, events)
	assert.Equal(t, n, calls)
	once := jobsCounted(t, h.reg, "written_once")
	assert.Positive(t, once, "parked jobs written once")
	t.Logf("%v of %d written once, %v claimed at a settle", once, n, jobsCounted(t, h.reg, "written_claimed"))
}

// A locked batch whose calls outlast the store delay is claimed when the
// delay is over, every row still running; the jobs then complete as any
// claimed job, once each.
func TestParkedBatchClaimedAtTheDelay(t *testing.T) {
	t.Parallel()
	const n = 40
	h := parkedRig(t, n, func(p Provider) Provider {
		return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
			time.Sleep(150 * time.Millisecond)
			return p.Chat(ctx, model, request)
		})
	})
	_, stop := startParked(h, func(c *Config) { c.StoreDelay = 30 * time.Millisecond })
	defer stop()
	assert.Equal(t, map[string]int{"succeeded": n}, h.wait(n, time.Minute))
	assert.Equal(t, n, rowsWhere(t, h, `status = 'succeeded' AND attempts = 1 AND jsonb_array_length(attempt_log) = 1`))
	assert.Positive(t, jobsCounted(t, h.reg, "written_claimed"), "the first batch, locked before any call was timed, is claimed at the delay")
}

// A job of a locked batch that fails has its row claimed before the
// failure is recorded, with the rest of its batch; the others succeed.
func TestParkedBatchFailureWritesTheBatch(t *testing.T) {
	t.Parallel()
	const n = 30
	h := parkedRig(t, n, func(p Provider) Provider {
		return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
			if strings.Contains(string(request), "ticket 7\"") {
				return nil, &provider.Error{Class: ratecontrol.Classification{Kind: ratecontrol.KindClient, Status: 400, Message: "bad request"}}
			}
			return p.Chat(ctx, model, request)
		})
	})
	_, stop := startParked(h, nil)
	defer stop()
	assert.Equal(t, map[string]int{"succeeded": n - 1, "failed": 1}, h.wait(n, time.Minute))
	assert.Equal(t, 1, rowsWhere(t, h, `id = 'p-007' AND status = 'failed' AND attempts = 1`))
	assert.Equal(t, n-1, rowsWhere(t, h, `status = 'succeeded' AND attempts = 1`))
}

// A worker stopped while its locked batch runs writes nothing of it: the
// rows stay parked, no attempt spent, and the next worker runs them.
func TestParkedBatchLeftParkedAtAStop(t *testing.T) {
	t.Parallel()
	const n = 10
	var entered atomic.Int32
	h := parkedRig(t, n, func(p Provider) Provider {
		return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
			entered.Add(1)
			<-ctx.Done()
			return nil, ctx.Err()
		})
	})
	_, stop := startParked(h, func(c *Config) { c.StoreDelay = time.Second; c.ShutdownGrace = 10 * time.Millisecond })
	require.Eventually(t, func() bool { return entered.Load() > 0 }, time.Minute, 5*time.Millisecond)
	stop()
	assert.Equal(t, n, rowsWhere(t, h, `status = 'queued' AND parked_at IS NOT NULL AND attempts = 0`), "every row parked as before")

	h.call = h.prov
	_, stop = startParked(h, nil)
	defer stop()
	assert.Equal(t, map[string]int{"succeeded": n}, h.wait(n, time.Minute))
}
