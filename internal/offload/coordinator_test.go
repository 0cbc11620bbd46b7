package offload

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// rig is a store with batched jobs, a simulator serving the Batch API and
// an in-memory broker for the wake-ups of jobs sent online.
type rig struct {
	t     *testing.T
	st    *store.Store
	pool  *pgxpool.Pool
	sim   *sim.Simulator
	mem   *memory.Broker
	model Model
	keys  []job.Key
}

func newRig(t *testing.T, bc sim.BatchConfig, b config.Batch) *rig {
	t.Helper()
	pool := testsvc.Postgres(t)
	s, err := sim.New(sim.Config{Models: map[string]sim.ModelConfig{"up-plus": {}}, Batch: bc})
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	t.Cleanup(func() { s.Close(); srv.Close() })
	if b.MaxJobs == 0 {
		b.MaxJobs = 100
	}
	b.Enabled, b.MaxBytes, b.MaxOpen = true, 1<<20, 10
	if b.CompletionWindow == 0 {
		b.CompletionWindow = time.Hour
	}
	return &rig{t: t, st: store.New(pool), pool: pool, sim: s, mem: memory.New(memory.Config{}),
		model: Model{Upstream: "up-plus", Batch: b, API: NewClient(config.Provider{BaseURL: srv.URL + "/v1"})}}
}

// batch stores n jobs (deadline dl, may be nil) and offloads them.
func (r *rig) batch(prefix string, n int, dl *time.Time) {
	r.t.Helper()
	ctx := context.Background()
	for i := range n {
		j := job.Job{ID: fmt.Sprintf("%s-%03d", prefix, i), Model: "qwen-plus", Priority: job.PriorityLow, Deadline: dl,
			Request: []byte(fmt.Sprintf(`{"messages":[{"role":"user","content":"ticket %s %d"}],"max_tokens":8}`, prefix, i))}
		j.Normalize()
		_, _, err := r.st.Insert(ctx, j)
		require.NoError(r.t, err)
		c, err := r.st.Claim(ctx, j.Key(), "w1", time.Minute)
		require.NoError(r.t, err)
		ok, err := r.st.MarkBatched(ctx, c.AttemptOf("w1"))
		require.NoError(r.t, err)
		require.True(r.t, ok)
		r.keys = append(r.keys, j.Key())
	}
}

func (r *rig) coordinator(fp func(string)) *Coordinator {
	c, err := New(Params{Store: r.st, Models: map[string]Model{"qwen-plus": r.model}, Lanes: r.mem.Publisher(), Failpoint: fp})
	require.NoError(r.t, err)
	return c
}

func (r *rig) count(cond string) int {
	var n int
	require.NoError(r.t, r.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE `+cond).Scan(&n))
	return n
}

// passUntil runs passes until no job is batched and no batch is open.
func (r *rig) passUntil(c *Coordinator) {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond) // the simulated batch's processing time passes
	defer tick.Stop()
	for {
		c.Pass(context.Background())
		var open int
		require.NoError(r.t, r.pool.QueryRow(context.Background(), `SELECT count(*) FROM batches WHERE state <> 'done'`).Scan(&open))
		if open == 0 && r.count(`status = 'batched'`) == 0 {
			return
		}
		require.True(r.t, time.Now().Before(deadline), "batches still open after a minute")
		<-tick.C
	}
}

func (r *rig) woken() int64 {
	d, err := r.mem.Inspector().Depth(context.Background(), job.PriorityLow)
	require.NoError(r.t, err)
	return d
}

// A batch with partial failures: each successful line is stored once as
// its job's result, each failed line's job goes back online with a wake-up
// (its attempt used), one upload and one batch per batch.
func TestCoordinatorStoresResultsAndSendsFailuresOnline(t *testing.T) {
	t.Parallel()
	r := newRig(t, sim.BatchConfig{FailFraction: 0.2}, config.Batch{MaxJobs: 40})
	r.batch("pf", 100, nil)
	r.passUntil(r.coordinator(nil))

	succeeded, retrying := r.count(`status = 'succeeded'`), r.count(`status = 'retrying'`)
	require.Equal(t, 100, succeeded+retrying)
	require.Positive(t, retrying)
	require.Equal(t, 100, r.count(`status <> 'succeeded' OR (model_used = 'qwen-plus' AND response->'choices' IS NOT NULL)`))
	require.Equal(t, int64(retrying), r.woken(), "every job sent online has its wake-up")
	require.Equal(t, retrying, r.count(`status = 'retrying' AND attempts = 1 AND errors->0->>'kind' = 'batch'`))
	st := r.sim.BatchStats()
	require.Equal(t, 3, st.Batches, "100 jobs at max_jobs 40")
	require.Equal(t, 3, st.Uploads)
	var events int
	require.NoError(t, r.pool.QueryRow(context.Background(), `SELECT count(*) FROM result_events`).Scan(&events))
	require.Equal(t, succeeded, events, "one result event per stored result")
}

// killed runs a pass that "dies" at the failpoint (the hook panics, as the
// real one kills the process) and reports whether it fired.
func killed(c *Coordinator) (fired bool) {
	defer func() {
		if v := recover(); v != nil {
			fired = true
		}
	}()
	c.Pass(context.Background())
	return false
}

// A coordinator that dies at any step is replaced by a new one (nothing
// kept in memory), which resumes the same batch: one upload and one batch,
// every job's result stored once.
func TestCoordinatorResumesAfterAKillAtEachStep(t *testing.T) {
	t.Parallel()
	for _, point := range Failpoints {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, sim.BatchConfig{}, config.Batch{MaxJobs: 100})
			r.batch("k", 30, nil)
			die := func(name string) {
				if name == point {
					panic("killed at " + name)
				}
			}
			require.True(t, killed(r.coordinator(die)), "the failpoint fires")
			r.passUntil(r.coordinator(nil))
			require.Equal(t, 30, r.count(`status = 'succeeded'`))
			st := r.sim.BatchStats()
			require.Equal(t, 1, st.Uploads, "no second upload")
			require.Equal(t, 1, st.Batches, "no second batch")
			var events int
			require.NoError(t, r.pool.QueryRow(context.Background(), `SELECT count(*) FROM result_events`).Scan(&events))
			require.Equal(t, 30, events, "each result stored once")
		})
	}
}

// An expired batch sends every job online with its attempt given back;
// a batched job near its deadline goes online before its batch ends.
func TestCoordinatorExpiryAndDeadlines(t *testing.T) {
	t.Parallel()
	r := newRig(t, sim.BatchConfig{Expire: true}, config.Batch{CompletionWindow: time.Second, Margin: time.Minute})
	r.batch("exp", 10, nil)
	r.passUntil(r.coordinator(nil))
	require.Equal(t, 10, r.count(`status = 'retrying' AND attempts = 0 AND errors->0->>'code' = 'batch_expired'`))
	require.Equal(t, 1, r.sim.BatchStats().Expired)

	near := time.Now().Add(30 * time.Second)
	r.batch("near", 3, &near)
	r.coordinator(nil).Pass(context.Background())
	require.Equal(t, 3, r.count(`id LIKE 'near-%' AND status = 'retrying' AND errors->0->>'code' = 'deadline_near'`))
	require.Equal(t, int64(13), r.woken())
}

// The waiting jobs of a model whose batch: was turned off go online.
func TestCoordinatorSendsOnlineWhenBatchingIsOff(t *testing.T) {
	t.Parallel()
	r := newRig(t, sim.BatchConfig{}, config.Batch{})
	r.batch("off", 5, nil)
	r.model.Batch.Enabled = false
	r.coordinator(nil).Pass(context.Background())
	require.Equal(t, 5, r.count(`status = 'retrying' AND errors->0->>'code' = 'batch_disabled'`))
	require.Zero(t, r.sim.BatchStats().Uploads)
	require.Equal(t, int64(5), r.woken())
}
