package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/leakcheck"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) {
	leakcheck.Main(m, append(leakcheck.LateCleanup(),
		// kafka-go's shared Transport keeps its connection pool goroutines
		// after the driver's Close (reported to the broker driver's owner).
		goleak.IgnoreTopFunction("github.com/segmentio/kafka-go.(*connPool).discover"),
		goleak.IgnoreTopFunction("github.com/segmentio/kafka-go.(*conn).run"),
	)...)
}

// notifyStore is the real store with a signal per terminal outcome, so
// tests wait for "n jobs finished" instead of polling or sleeping.
type notifyStore struct {
	*store.Store
	events chan string
}

func (s *notifyStore) emit(kind string, n int) {
	for range n {
		s.events <- kind
	}
}

// emitDone emits "succeeded" for each item of a batch stored.
func (s *notifyStore) emitDone(ok []bool) {
	n := 0
	for _, b := range ok {
		if b {
			n++
		}
	}
	s.emit("succeeded", n)
}

func (s *notifyStore) CompleteBatch(ctx context.Context, items []store.Completion) ([]bool, error) {
	ok, err := s.Store.CompleteBatch(ctx, items)
	s.emitDone(ok)
	return ok, err
}

func (s *notifyStore) InsertFinished(ctx context.Context, items []store.Finished) ([]bool, error) {
	ok, err := s.Store.InsertFinished(ctx, items)
	s.emitDone(ok)
	return ok, err
}

func (s *notifyStore) SettleParked(ctx context.Context, l *store.ParkedLock, succeeded []store.ParkedSuccess, claim []job.Key) ([]bool, error) {
	ok, err := s.Store.SettleParked(ctx, l, succeeded, claim)
	s.emitDone(ok)
	return ok, err
}

func (s *notifyStore) Fail(ctx context.Context, a store.Attempt, e store.AttemptError) (bool, error) {
	ok, err := s.Store.Fail(ctx, a, e)
	if ok {
		s.emit("failed", 1)
	}
	return ok, err
}

func (s *notifyStore) RecordDeadLetter(ctx context.Context, dl store.DeadLetterRow) (int64, error) {
	id, err := s.Store.RecordDeadLetter(ctx, dl)
	s.emit("dead", 1)
	return id, err
}

// ClaimBatch reports the jobs a claim found exhausted: the claim moves
// them to dead and records their dead letters.
func (s *notifyStore) ClaimBatch(ctx context.Context, keys []job.Key, owner string, lease time.Duration) ([]store.Claim, error) {
	cs, err := s.Store.ClaimBatch(ctx, keys, owner, lease)
	for _, c := range cs {
		if c.Outcome == store.Exhausted {
			s.emit("dead", 1)
		}
	}
	return cs, err
}

func (s *notifyStore) MarkDeadLettered(ctx context.Context, a store.Attempt, e store.AttemptError, dl store.DeadLetterRow) (bool, error) {
	ok, err := s.Store.MarkDeadLettered(ctx, a, e, dl)
	if ok {
		s.emit("dead", 1)
	}
	return ok, err
}

// providerFunc adapts a function to Provider.
type providerFunc func(ctx context.Context, model string, request []byte) (*provider.Response, error)

func (f providerFunc) Chat(ctx context.Context, model string, request []byte) (*provider.Response, error) {
	return f(ctx, model, request)
}

type harness struct {
	t      testing.TB
	pool   *pgxpool.Pool
	store  *store.Store
	ns     *notifyStore
	sim    *sim.Simulator
	prov   *provider.Client
	call   Provider // what the worker calls (prov unless a test wraps it)
	stop   func()   // stops the worker start ran last
	cfg    Config
	models map[string]config.Model
	reg    *prometheus.Registry
	// lanes, when set before start, is the worker's Deps.Lanes (parking
	// and the direct intake on).
	lanes  broker.Publisher
	tracer *telemetry.Tracer // nil: tracing off
}

// newHarness builds a harness; pgOpts adjust its pool's configuration.
func newHarness(t testing.TB, simCfg sim.Config, models map[string]config.Model, pgOpts ...func(*pgxpool.Config)) *harness {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(testsvc.PostgresURL(t))
	require.NoError(t, err)
	pcfg.MaxConns = 8 // pgx defaults to 4; tests run in parallel on a shared server
	for _, o := range pgOpts {
		o(pcfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st := store.New(pool)
	s, err := sim.New(simCfg)
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	t.Cleanup(func() { s.Close(); srv.Close() })
	prov, err := provider.New(provider.Config{BaseURL: srv.URL + "/v1", APIKey: config.Secret("sk-harness-key"), Timeout: 30 * time.Second, MaxConns: 256})
	require.NoError(t, err)
	t.Cleanup(prov.Close)
	h := &harness{
		t: t, pool: pool, store: st, ns: &notifyStore{Store: st, events: make(chan string, 1<<16)}, sim: s, prov: prov, models: models,
		cfg: Config{Owner: "test-worker", Lease: 30 * time.Second, RetryBase: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond,
			ShutdownGrace: 10 * time.Second, Models: models, MaxInFlight: 1000, Prefetch: 200},
	}
	h.call = prov
	return h
}

// enteredProvider signals every call that reaches the provider.
type enteredProvider struct {
	Provider
	entered chan struct{}
}

func (p *enteredProvider) Chat(ctx context.Context, model string, request []byte) (*provider.Response, error) {
	p.entered <- struct{}{}
	return p.Provider.Chat(ctx, model, request)
}

// waitFor waits until n calls have reached the provider, failing tb after
// within.
func (p *enteredProvider) waitFor(tb testing.TB, n int, within time.Duration) {
	tb.Helper()
	timeout := time.After(within)
	for i := 0; i < n; i++ {
		select {
		case <-p.entered:
		case <-timeout:
			tb.Fatalf("only %d of %d calls reached the provider", i, n)
		}
	}
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("LLMQ_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// start runs a worker on sub until the returned stop is called.
func (h *harness) start(sub broker.Subscriber, cfg Config) (w *Worker, stop func()) {
	h.t.Helper()
	h.reg = prometheus.NewRegistry()
	w, err := New(cfg, Deps{Store: h.ns, Subscriber: sub, Provider: h.call, Lanes: h.lanes,
		Governor: GovernorFactory(h.models, "auto"), Logger: testLogger(h.t), Registerer: h.reg, Tracer: h.tracer})
	require.NoError(h.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(h.t, err)
			case <-time.After(60 * time.Second):
				h.t.Fatal("worker did not stop within 60s")
			}
		})
	}
	h.t.Cleanup(stop)
	h.stop = stop
	return w, stop
}

// wait waits for n terminal outcomes and returns them counted by kind.
func (h *harness) wait(n int, within time.Duration) map[string]int {
	h.t.Helper()
	got := map[string]int{}
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for i := 0; i < n; i++ {
		select {
		case k := <-h.ns.events:
			got[k]++
		case <-deadline.C:
			h.t.Fatalf("only %d of %d jobs finished within %s: %v", i, n, within, got)
		}
	}
	return got
}

// jobBody builds a job message; long ones have a long prompt and max_tokens 512.
func jobBody(id, model string, i int, extra map[string]any) []byte {
	content := fmt.Sprintf("question %d: summarise ticket %s", i, id)
	maxTokens := 64
	if i%10 < 3 {
		content += " " + string(make([]byte, 0)) + fmt.Sprintf("%0600d", i)
		maxTokens = 512
	}
	j := map[string]any{"id": id, "model": model, "request": map[string]any{
		"messages": []map[string]string{{"role": "user", "content": content}}, "max_tokens": maxTokens}}
	for k, v := range extra {
		j[k] = v
	}
	b, _ := json.Marshal(j)
	return b
}

func laneOf(i int) job.Priority { return job.Priorities[i%3] }

// checkResults asserts every job succeeded exactly once with the content
// the simulator gives its request.
func (h *harness) checkResults(ctx context.Context, bodies map[string][]byte) {
	h.t.Helper()
	for id, body := range bodies {
		rec, err := h.store.Get(ctx, job.Key{Tenant: job.DefaultTenant, ID: id})
		require.NoError(h.t, err)
		require.Equal(h.t, job.StatusSucceeded, rec.Status, "job %s: %+v", id, rec.Errors)
		var resp struct {
			Choices []struct {
				Message struct{ Content string }
			}
		}
		require.NoError(h.t, json.Unmarshal(rec.Response, &resp))
		var j job.Job
		require.NoError(h.t, json.Unmarshal(body, &j))
		req, err := provider.SetTopLevel(j.Request, "model", []byte(`"`+rec.ModelUsed+`"`))
		require.NoError(h.t, err)
		require.Equal(h.t, sim.ExpectedContent(req), resp.Choices[0].Message.Content, "job %s", id)
	}
}

// countJobs is how many jobs match where (SQL, args from $1).
func (h *harness) countJobs(tb testing.TB, where string, args ...any) int {
	tb.Helper()
	var n int
	require.NoError(tb, h.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE `+where, args...).Scan(&n))
	return n
}
