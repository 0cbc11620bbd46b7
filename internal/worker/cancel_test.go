package worker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/store"
)

// hangingProvider blocks every call until its context ends and reports
// each call's start and how it ended.
type hangingProvider struct {
	entered chan job.Key
	ended   chan error
}

func newHangingProvider() *hangingProvider {
	return &hangingProvider{entered: make(chan job.Key, 64), ended: make(chan error, 64)}
}

func (p *hangingProvider) Chat(ctx context.Context, _ string, _ []byte) (*provider.Response, error) {
	p.entered <- job.Key{}
	<-ctx.Done()
	p.ended <- ctx.Err()
	return nil, ctx.Err()
}

// cancelRig is a worker on a hanging provider with the cancellation
// listener running, as `consumer run` wires them.
type cancelRig struct {
	h    *harness
	prov *hangingProvider
	pub  broker.Publisher
}

func newCancelRig(t testing.TB) *cancelRig {
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"qwen-plus": {}}}, map[string]config.Model{"qwen-plus": {}})
	prov := newHangingProvider()
	h.call = prov
	mem := memory.New(memory.Config{})
	w, _ := h.start(mem.Subscriber(), h.cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	url := h.pool.Config().ConnConfig.ConnString()
	go func() {
		defer close(done)
		store.ListenCancels(ctx, func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, url) }, w.Abort, nil)
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitListening(t, h)
	return &cancelRig{h: h, prov: prov, pub: mem.Publisher()}
}

// waitListening waits until a session listens on the cancel channel.
func waitListening(t testing.TB, h *harness) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		require.NoError(t, h.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN `+store.CancelChannel+`'`).Scan(&n))
		if n > 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the cancellation listener did not start")
}

func (r *cancelRig) submit(t testing.TB, id, extra string) job.Key {
	body := []byte(fmt.Sprintf(`{"id":%q,"model":"qwen-plus","request":{"messages":[{"role":"user","content":"hang"}],"max_tokens":8}%s}`, id, extra))
	r.h.submit(r.pub, job.PriorityNormal, id, body)
	return job.Key{Tenant: job.DefaultTenant, ID: id}
}

func (r *cancelRig) entered(t testing.TB) {
	select {
	case <-r.prov.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the provider was not called")
	}
}

func (r *cancelRig) ended(t testing.TB) error {
	select {
	case err := <-r.prov.ended:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the provider call was not stopped")
		return nil
	}
}

// Cancelling a job during its provider call cancels the call's context,
// and the job ends cancelled, once.
func TestCancelStopsTheProviderCall(t *testing.T) {
	t.Parallel()
	r := newCancelRig(t)
	key := r.submit(t, "hang-1", "")
	r.entered(t)
	rec, err := r.h.store.Cancel(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, job.StatusCancelled, rec.Status)
	assert.ErrorIs(t, r.ended(t), context.Canceled)
	// The worker settles the delivery and writes nothing over the cancel.
	time.Sleep(200 * time.Millisecond)
	got, err := r.h.store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, job.StatusCancelled, got.Status)
	assert.Empty(t, got.Errors)
}

// A job's deadline bounds its provider call: the call's context ends at
// the deadline and the job is dead with that reason.
func TestDeadlineBoundsTheProviderCall(t *testing.T) {
	t.Parallel()
	r := newCancelRig(t)
	dl := time.Now().Add(1500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	key := r.submit(t, "hang-dl", `,"deadline":"`+dl+`"`)
	r.entered(t)
	assert.True(t, errors.Is(r.ended(t), context.DeadlineExceeded))
	require.Eventually(t, func() bool {
		got, err := r.h.store.Get(context.Background(), key)
		return err == nil && got.Status == job.StatusDead
	}, 10*time.Second, 20*time.Millisecond)
	got, err := r.h.store.Get(context.Background(), key)
	require.NoError(t, err)
	require.NotEmpty(t, got.Errors)
	assert.Equal(t, "deadline", got.Errors[len(got.Errors)-1].Kind)
}

// BenchmarkCancelToAbort measures the time from a running job's
// cancellation (store.Cancel returns) to its provider call's context
// ending, through the NOTIFY and the worker's listener.
//
//	go test -run '^$' -bench CancelToAbort -benchtime 50x ./internal/worker/
func BenchmarkCancelToAbort(b *testing.B) {
	r := newCancelRig(b)
	lat := make([]time.Duration, 0, b.N)
	for i := 0; b.Loop(); i++ {
		key := r.submit(b, fmt.Sprintf("hang-%d", i), "")
		r.entered(b)
		start := time.Now()
		_, err := r.h.store.Cancel(context.Background(), key)
		require.NoError(b, err)
		require.ErrorIs(b, r.ended(b), context.Canceled)
		lat = append(lat, time.Since(start))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
