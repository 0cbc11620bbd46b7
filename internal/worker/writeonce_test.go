package worker

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/sim"
)

// writeOnceRig is a worker with an ingester beside it on real RabbitMQ
// and Postgres, its provider calls counted.
type writeOnceRig struct {
	h   *harness
	w   *Worker
	pub interface {
		PublishIntake(context.Context, job.Priority, broker.Message) error
	}
	calls *atomic.Int32
	ireg  *prometheus.Registry // the ingester's metrics
	amqp  rabbitmq.Config      // the intake and lanes, for queued
	stop  func()               // stops the ingester, then the worker
}

func newWriteOnceRig(t *testing.T, wrap func(Provider) Provider) *writeOnceRig {
	t.Helper()
	return newWriteOnceRigWith(t, wrap, nil)
}

// newWriteOnceRigWith is newWriteOnceRig with the ingester's store wrapped
// by wrapStore (nil: not wrapped).
func newWriteOnceRigWith(t *testing.T, wrap func(Provider) Provider, wrapStore func(ingest.Store) ingest.Store, pgOpts ...func(*pgxpool.Config)) *writeOnceRig {
	t.Helper()
	cfgR, pub, sub := rabbitClients(t)
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"m": {}}},
		map[string]config.Model{"m": {Strategy: "ratelimit", MaxConcurrency: 64}}, pgOpts...)
	h.lanes = pub
	calls := new(atomic.Int32)
	inner := h.call
	if wrap != nil {
		inner = wrap(inner)
	}
	h.call = providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
		calls.Add(1)
		return inner.Chat(ctx, model, request)
	})
	w, stopW := h.start(sub, h.cfg)
	awaitAccepting(t, w)
	ireg := prometheus.NewRegistry()
	var ist ingest.Store = h.store
	if wrapStore != nil {
		ist = wrapStore(ist)
	}
	ing, err := ingest.New(ingest.Config{}, ingest.Deps{Store: ist, Intake: intakeSubscriber(t, cfgR), Lanes: pub, Runner: w, Registerer: ireg})
	require.NoError(t, err)
	ictx, stopIngest := context.WithCancel(context.Background())
	ingDone := make(chan error, 1)
	go func() { ingDone <- ing.Run(ictx) }()
	r := &writeOnceRig{h: h, w: w, pub: pub, calls: calls, ireg: ireg, amqp: cfgR}
	r.stop = func() {
		stopIngest()
		require.NoError(t, <-ingDone)
		stopW()
	}
	t.Cleanup(func() { stopIngest() })
	return r
}

func (r *writeOnceRig) publish(t *testing.T, ids ...string) {
	t.Helper()
	for i, id := range ids {
		require.NoError(t, r.pub.PublishIntake(context.Background(), job.PriorityNormal, broker.Message{Key: id, Body: jobBody(id, "m", i, nil)}))
	}
}

// countDeadLetters counts the dead letters that match where.
func (r *writeOnceRig) countDeadLetters(t *testing.T, where string) int {
	t.Helper()
	var n int
	require.NoError(t, r.h.pool.QueryRow(context.Background(), `SELECT count(*) FROM dead_letters WHERE `+where).Scan(&n))
	return n
}

// queued counts the messages ready in the normal lane's intake and lane
// queues; once the rig is stopped, its unsettled deliveries are among them.
func (r *writeOnceRig) queued(t *testing.T) int64 {
	t.Helper()
	in, err := rabbitmq.NewInspector(context.Background(), r.amqp)
	require.NoError(t, err)
	defer in.Close()
	n, err := in.Depth(context.Background(), job.PriorityNormal)
	require.NoError(t, err)
	return n
}

func (r *writeOnceRig) count(t *testing.T, where string) int {
	t.Helper()
	return r.h.countJobs(t, where)
}

// A job read off the intake whose call succeeds within the store delay is
// written once, finished, with its outbox row; its intake message is
// acked then, so nothing runs again after a restart.
func TestWriteOnceStoresAFastJobFinished(t *testing.T) {
	t.Parallel()
	const n = 20
	r := newWriteOnceRig(t, nil)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("once-%d", i)
	}
	r.publish(t, ids...)
	assert.Equal(t, map[string]int{"succeeded": n}, r.h.wait(n, time.Minute))
	require.Eventually(t, func() bool { return jobsCounted(t, r.h.reg, "written_once") == n },
		time.Minute, time.Millisecond, "counted once the insert returned")
	assert.Equal(t, float64(0), jobsCounted(t, r.h.reg, "written_claimed"))
	assert.Equal(t, n, r.count(t, `status = 'succeeded' AND attempts = 1 AND jsonb_array_length(attempt_log) = 1`))
	var events int
	require.NoError(t, r.h.pool.QueryRow(context.Background(), `SELECT count(*) FROM result_events WHERE status = 'succeeded'`).Scan(&events))
	assert.Equal(t, n, events)

	// The same jobs published again are duplicates of stored jobs: the
	// probe finds their rows and none is called again.
	r.publish(t, ids...)
	require.Eventually(t, func() bool {
		return counted(t, r.ireg, "llmq_ingest_messages_total", "outcome", "duplicate") == n
	}, time.Minute, 10*time.Millisecond, "the second messages judged duplicates")
	r.stop()
	assert.Equal(t, int32(n), r.calls.Load(), "each job called once")
}

// A job whose call outlasts the store delay is visible while it runs:
// its row is written claimed, then completed as any direct job.
func TestWriteOnceWritesASlowJobClaimed(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	r := newWriteOnceRig(t, func(inner Provider) Provider {
		return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
			<-release
			return inner.Chat(ctx, model, request)
		})
	})
	r.publish(t, "slow")
	require.Eventually(t, func() bool {
		return r.count(t, `id = 'slow' AND status = 'running' AND attempts = 1`) == 1 && jobsCounted(t, r.h.reg, "written_claimed") == 1
	}, time.Minute, 10*time.Millisecond, "visible while its call runs, written by the write-once writer")
	close(release)
	assert.Equal(t, map[string]int{"succeeded": 1}, r.h.wait(1, time.Minute))
	assert.Equal(t, float64(0), jobsCounted(t, r.h.reg, "written_once"))
}

// A job whose call fails within the store delay is written before its
// failure is recorded: failed, with the error, as any direct job.
func TestWriteOnceWritesAFailureFirst(t *testing.T) {
	t.Parallel()
	r := newWriteOnceRig(t, func(Provider) Provider {
		return providerFunc(func(context.Context, string, []byte) (*provider.Response, error) {
			return nil, &provider.Error{Class: ratecontrol.Classification{Kind: ratecontrol.KindClient, Status: 400, Message: "bad request"}}
		})
	})
	r.publish(t, "refused")
	assert.Equal(t, map[string]int{"failed": 1}, r.h.wait(1, time.Minute))
	assert.Equal(t, 1, r.count(t, `id = 'refused' AND status = 'failed' AND attempts = 1 AND jsonb_array_length(errors) = 1`))
	assert.Equal(t, float64(1), jobsCounted(t, r.h.reg, "written_claimed"))
	assert.Equal(t, float64(0), jobsCounted(t, r.h.reg, "written_once"))
}

// A second message of a job that runs here unwritten has the first's row
// written before it is judged: a duplicate, not a second call.
func TestWriteOnceJudgesASecondMessageAgainstTheFirst(t *testing.T) {
	t.Parallel()
	release, entered := make(chan struct{}), new(atomic.Int32)
	r := newWriteOnceRig(t, func(inner Provider) Provider {
		return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
			entered.Add(1)
			<-release
			return inner.Chat(ctx, model, request)
		})
	})
	r.publish(t, "twice")
	require.Eventually(t, func() bool { return entered.Load() == 1 }, time.Minute, time.Millisecond)
	r.publish(t, "twice")
	require.Eventually(t, func() bool {
		return counted(t, r.ireg, "llmq_ingest_messages_total", "outcome", "duplicate") == 1
	}, time.Minute, time.Millisecond, "the second message judged a duplicate")
	close(release)
	assert.Equal(t, map[string]int{"succeeded": 1}, r.h.wait(1, time.Minute))
	r.stop()
	assert.Equal(t, int32(1), r.calls.Load(), "called once")
}

// Once a model's calls take longer than half the store delay, its jobs
// are stored claimed by the ingester at once instead of handed on: they
// would not finish within the delay anyway.
func TestWriteOnceSkipsAModelWithSlowCalls(t *testing.T) {
	t.Parallel()
	r := newWriteOnceRig(t, func(inner Provider) Provider {
		return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
			time.Sleep(300 * time.Millisecond)
			return inner.Chat(ctx, model, request)
		})
	})
	r.publish(t, "first")
	assert.Equal(t, map[string]int{"succeeded": 1}, r.h.wait(1, time.Minute))
	assert.Equal(t, float64(1), jobsCounted(t, r.h.reg, "written_claimed"), "the first, before any call was timed")
	r.publish(t, "second")
	assert.Equal(t, map[string]int{"succeeded": 1}, r.h.wait(1, time.Minute))
	assert.Equal(t, float64(2), jobsCounted(t, r.h.reg, "direct"))
	assert.Equal(t, float64(1), jobsCounted(t, r.h.reg, "written_claimed"), "the second stored claimed by the ingester")
	assert.Equal(t, float64(0), jobsCounted(t, r.h.reg, "written_once"))
}
