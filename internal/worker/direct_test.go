package worker

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/sim"
)

// A job read off the intake by a replica with room runs there without a
// lane message; one that replica cannot finish (its calls cut by the end of
// the shutdown grace) is handed back through the lane, and another replica
// runs it. Every job succeeds once.
func TestDirectIntakeRunsAndHandsBack(t *testing.T) {
	t.Parallel()
	const n = 12
	cfgR, pub, sub := rabbitClients(t)
	// A fixed concurrency above n: admission never waits, so the model is
	// never saturated and every job can be taken directly.
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"m": {}}},
		map[string]config.Model{"m": {Strategy: "ratelimit", MaxConcurrency: 4 * n}})
	h.lanes = pub
	ctx := context.Background()

	// First replica: its calls block until the shutdown grace cuts them.
	release, entered, inner := blockCalls(h)
	cfg := h.cfg
	cfg.ShutdownGrace = 100 * time.Millisecond
	a, stopA := h.start(sub, cfg)
	ing, err := ingest.New(ingest.Config{}, ingest.Deps{Store: h.store, Intake: intakeSubscriber(t, cfgR), Lanes: pub, Runner: a})
	require.NoError(t, err)
	ictx, stopIngest := context.WithCancel(ctx)
	ingDone := make(chan error, 1)
	go func() { ingDone <- ing.Run(ictx) }()
	for i := range n {
		id := fmt.Sprintf("direct-%d", i)
		require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: jobBody(id, "m", i, nil)}))
	}
	require.Eventually(t, func() bool { return entered.Load() == n }, 2*time.Minute, 10*time.Millisecond,
		"every job reaches the first replica's provider call")
	assert.Equal(t, float64(n), jobsCounted(t, h.reg, "direct"), "taken without a lane")
	assert.Equal(t, float64(n), counted(t, h.reg, "llmq_worker_messages_received_total", "lane", "normal"),
		"no lane delivery besides the direct jobs")
	// Their calls outlast the store delay: the rows are written claimed
	// (the count follows the commit).
	require.Eventually(t, func() bool {
		var running int
		require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = 'running' AND attempts = 1`).Scan(&running))
		return running == n && jobsCounted(t, h.reg, "written_claimed") == n
	}, time.Minute, 10*time.Millisecond, "stored claimed, attempt 1, by the write-once writer")

	stopIngest()
	require.NoError(t, <-ingDone)
	stopA() // grace over: the calls are cut, the jobs handed back through the lane
	close(release)

	h.call = inner
	cfgB := h.cfg
	cfgB.Owner = "replica-b"
	h.start(sub, cfgB)
	got := h.wait(n, time.Minute)
	assert.Equal(t, map[string]int{"succeeded": n}, got)
	var owners []string
	rows, err := h.pool.Query(ctx, `SELECT DISTINCT model_used FROM jobs WHERE status = 'succeeded'`)
	require.NoError(t, err)
	for rows.Next() {
		var m string
		require.NoError(t, rows.Scan(&m))
		owners = append(owners, m)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{"m"}, owners)
}

// blockCalls makes h's provider calls wait until release is closed (or
// their context ends), counting them in entered; inner is the provider
// they go on to.
func blockCalls(h *harness) (release chan struct{}, entered *atomic.Int32, inner Provider) {
	release, entered, inner = make(chan struct{}), new(atomic.Int32), h.call
	h.call = providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
		entered.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return inner.Chat(ctx, model, request)
	})
	return release, entered, inner
}

// counted reads the counter name{label=value} from reg.
func counted(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// floodIntake starts a worker tuned by tune, whose calls to model m (at
// most calls at once) block until release is closed, and an ingester
// beside it, and publishes n jobs of one group on the intake.
func floodIntake(t testing.TB, calls, n int, prefix string, tune func(*Config)) (h *harness, release chan struct{}, entered *atomic.Int32) {
	t.Helper()
	cfgR, pub, sub := rabbitClients(t)
	h = newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"m": {}}},
		map[string]config.Model{"m": {Strategy: "ratelimit", MaxConcurrency: calls}})
	h.lanes = pub
	ctx := context.Background()

	release, entered, _ = blockCalls(h)
	cfg := h.cfg
	tune(&cfg)
	w, _ := h.start(sub, cfg)
	awaitAccepting(t, w) // a job read before the worker takes work takes its lane
	ing, err := ingest.New(ingest.Config{}, ingest.Deps{Store: h.store, Intake: intakeSubscriber(t, cfgR), Lanes: pub, Runner: w})
	require.NoError(t, err)
	ictx, stopIngest := context.WithCancel(ctx)
	t.Cleanup(stopIngest)
	go func() { _ = ing.Run(ictx) }()
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: jobBody(id, "m", i, nil)}))
	}
	return h, release, entered
}

// awaitAccepting waits until w's Run takes work.
func awaitAccepting(t testing.TB, w *Worker) {
	t.Helper()
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.accepting
	}, time.Minute, time.Millisecond, "the worker takes work")
}

// A flood of one group read off the intake while its calls cannot finish:
// the replica takes what the direct intake admits of the group and stores
// the rest parked, not on the lane, and its unparker runs them as room
// frees. No job goes through the lane; every one succeeds once.
func TestDirectIntakeParksOverflow(t *testing.T) {
	t.Parallel()
	const n, calls = 40, 4
	h, release, entered := floodIntake(t, calls, n, "flood", func(cfg *Config) { cfg.TenantHold = 2 })
	ctx := context.Background()
	var stored, parked int
	require.Eventually(t, func() bool {
		require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE parked_at IS NOT NULL) FROM jobs`).Scan(&stored, &parked))
		return entered.Load() == calls && stored == n
	}, time.Minute, 10*time.Millisecond, "every job stored, %d calls made", calls)
	assert.Positive(t, parked, "what the group's hold does not take waits parked")

	close(release)
	assert.Equal(t, map[string]int{"succeeded": n}, h.wait(n, time.Minute))
	var laned int
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE enqueued_at IS NOT NULL`).Scan(&laned))
	assert.Zero(t, laned, "no job was published on its lane")
	// A job may be parked again while it waits (excess) and counted
	// unparked twice; each path was taken.
	assert.Positive(t, jobsCounted(t, h.reg, "direct"))
	assert.Positive(t, jobsCounted(t, h.reg, "unparked"))
}

// A job Reserve turns down because every slot of max_in_flight is taken is
// parked when its group holds jobs here, however far the group is from
// its bound, and takes its lane when its group has nothing here.
func TestOverflowsParksAGroupThatHoldsJobsHere(t *testing.T) {
	t.Parallel()
	_, pub, sub := rabbitClients(t)
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"m": {}}}, map[string]config.Model{"m": {}})
	h.lanes = pub
	cfg := h.cfg
	// Each lane's receiver waits for a delivery with a slot in hand: three
	// of the six are theirs.
	cfg.MaxInFlight, cfg.TenantHold = 6, 100
	w, _ := h.start(sub, cfg)
	awaitAccepting(t, w)

	flood := func(i int) job.Job {
		return job.Job{Tenant: "acme", ID: fmt.Sprintf("f-%d", i), Model: "m", Priority: job.PriorityNormal}
	}
	var held []job.Job
	t.Cleanup(func() {
		for _, j := range held {
			w.Unreserve(j)
		}
	})
	for i := 0; i < 10 && w.Reserve(flood(i)); i++ {
		held = append(held, flood(i))
	}
	require.NotEmpty(t, held)
	require.Less(t, len(held), 10, "the slots run out")
	next := flood(len(held))
	assert.True(t, w.Overflows(next), "%d held of a bound of 100: parked behind them, not laned", len(held))
	other := job.Job{Tenant: "globex", ID: "g-1", Model: "m", Priority: job.PriorityNormal}
	require.False(t, w.Reserve(other))
	assert.False(t, w.Overflows(other), "a group with nothing here takes its lane")
}

// The ingester runs beside the worker and may ask it for room before Run
// has set itself up (the race detector watches what they share).
func TestIntakeMayAskBeforeRunStarts(t *testing.T) {
	t.Parallel()
	_, pub, sub := rabbitClients(t)
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"m": {}}}, map[string]config.Model{"m": {}})
	h.lanes = pub
	w, _ := h.start(sub, h.cfg)
	j := job.Job{Tenant: "acme", ID: "early", Model: "m", Priority: job.PriorityNormal}
	if w.Reserve(j) {
		w.Unreserve(j)
	}
	assert.False(t, w.Overflows(j), "a group with nothing held takes its lane")
}
