package reconcile_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/reconcile"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) {
	leakcheck.Main(m, leakcheck.LateCleanup()...)
}

type rig struct {
	t     *testing.T
	store *store.Store
	mem   *memory.Broker
	rec   *reconcile.Reconciler
	lanes map[job.Priority]<-chan broker.Delivery
	reg   *prometheus.Registry
}

func newRig(t *testing.T, cfg reconcile.Config) *rig {
	t.Helper()
	r := &rig{t: t, store: store.New(testsvc.Postgres(t)), mem: memory.New(memory.Config{}), reg: prometheus.NewRegistry()}
	t.Cleanup(func() { r.mem.Close() })
	rec, err := reconcile.New(cfg, reconcile.Deps{Store: r.store, Lanes: r.mem.Publisher(), Depth: r.mem.Inspector(),
		DeadLetters: r.mem, Registerer: r.reg})
	require.NoError(t, err)
	r.rec = rec
	return r
}

// subscribe starts reading the lanes (a message waiting there is then
// handed out, so the lane's depth is 0).
func (r *rig) subscribe() {
	ctx, cancel := context.WithCancel(context.Background())
	sub := r.mem.Subscriber()
	r.t.Cleanup(func() { cancel(); _ = sub.Close() })
	r.lanes = map[job.Priority]<-chan broker.Delivery{}
	for _, lane := range job.Priorities {
		ch, err := sub.Subscribe(ctx, lane, 1000)
		require.NoError(r.t, err)
		r.lanes[lane] = ch
	}
}

func (r *rig) expectMessage(lane job.Priority, id string) {
	r.t.Helper()
	select {
	case d := <-r.lanes[lane]:
		k, err := job.ReadKey(d.Message().Body)
		require.NoError(r.t, err)
		require.Equal(r.t, id, k.ID)
		require.NoError(r.t, d.Ack(context.Background()))
	case <-time.After(10 * time.Second):
		r.t.Fatalf("no message for %s on lane %s", id, lane)
	}
}

func (r *rig) expectNoMessage() {
	r.t.Helper()
	for lane, ch := range r.lanes {
		select {
		case d := <-ch:
			r.t.Fatalf("lane %s: unexpected message %s", lane, d.Message().Body)
		default:
		}
	}
}

func (r *rig) insert(id string, lane job.Priority) store.Record {
	r.t.Helper()
	res, err := r.store.InsertBatch(context.Background(), []job.Job{{ID: id, Model: "qwen-plus", Priority: lane,
		Request: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}]}`)}})
	require.NoError(r.t, err)
	require.True(r.t, res[0].Created)
	return res[0].Record
}

// eventually runs sweeps until cond holds (bounded).
func (r *rig) eventually(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: not within 20s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReconcilerPublishesJobsWithoutAMessage(t *testing.T) {
	t.Parallel()
	r := newRig(t, reconcile.Config{LostAfter: time.Hour})
	r.subscribe()
	ctx := context.Background()
	rec := r.insert("no-msg", job.PriorityHigh)
	r.rec.Sweep(ctx)
	r.expectNoMessage() // enqueued_at is set: a message is assumed to exist
	require.NoError(t, r.store.MarkUnenqueued(ctx, rec.Key()))
	r.rec.Sweep(ctx)
	r.expectMessage(job.PriorityHigh, "no-msg")
	got, err := r.store.Get(ctx, rec.Key())
	require.NoError(t, err)
	require.NotNil(t, got.EnqueuedAt, "marked enqueued after the publish")
	r.rec.Sweep(ctx)
	r.expectNoMessage()
}

func TestReconcilerRepublishesLostMessagesOfAnIdleLane(t *testing.T) {
	t.Parallel()
	r := newRig(t, reconcile.Config{LostAfter: time.Microsecond})
	ctx := context.Background()
	r.insert("lost", job.PriorityNormal)
	// A message waiting on the lane: the lost cannot be told from the
	// waiting, so nothing is published.
	require.NoError(t, r.mem.Publisher().Publish(ctx, job.PriorityNormal, broker.Message{Key: "other", Body: []byte(`{"id":"other"}`)}))
	r.rec.Sweep(ctx)
	depth, err := r.mem.Inspector().Depth(ctx, job.PriorityNormal)
	require.NoError(t, err)
	require.Equal(t, int64(1), depth, "nothing added while the lane has a message waiting")

	r.subscribe() // takes "other" off the lane
	r.expectMessage(job.PriorityNormal, "other")
	r.eventually("lost message re-published", func() bool {
		r.rec.Sweep(ctx)
		select {
		case d := <-r.lanes[job.PriorityNormal]:
			k, _ := job.ReadKey(d.Message().Body)
			require.Equal(t, "lost", k.ID)
			return true
		default:
			return false
		}
	})
}

func TestReconcilerRecordsBrokerDeadLetters(t *testing.T) {
	t.Parallel()
	r := newRig(t, reconcile.Config{Interval: 50 * time.Millisecond, LostAfter: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.rec.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	rec := r.insert("limit", job.PriorityLow)
	// The broker dead-letters a lane message past its delivery limit.
	sub := r.mem.Subscriber()
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(ctx, job.PriorityLow, 10)
	require.NoError(t, err)
	require.NoError(t, r.mem.Publisher().Publish(ctx, job.PriorityLow, broker.Message{Key: "limit", Body: []byte(`{"id":"limit"}`)}))
	d := <-ch
	require.NoError(t, d.DeadLetter(ctx, broker.DeadLetter{Reason: broker.ReasonDeliveryLimit}))

	r.eventually("job dead", func() bool {
		got, err := r.store.Get(ctx, rec.Key())
		require.NoError(t, err)
		return got.Status == job.StatusDead
	})
	dls, _, err := r.store.ListDeadLetters(ctx, job.DefaultTenant, "", 10)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "limit", dls[0].JobID)
	require.Equal(t, store.DeadLetterJob, dls[0].Kind)
	require.Contains(t, dls[0].Reason, "delivery limit")
}

func TestReconcilerFailsJobsOfUnconfiguredModels(t *testing.T) {
	t.Parallel()
	r := newRig(t, reconcile.Config{LostAfter: time.Hour, Models: []string{"qwen-flash"}})
	ctx := context.Background()
	rec := r.insert("old", job.PriorityNormal) // model qwen-plus, not configured
	r.rec.Sweep(ctx)
	got, err := r.store.Get(ctx, rec.Key())
	require.NoError(t, err)
	require.Equal(t, job.StatusFailed, got.Status)
	require.Contains(t, got.Errors[len(got.Errors)-1].Message, "not a configured model")
	dls, _, err := r.store.ListDeadLetters(ctx, job.DefaultTenant, "", 10)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	backlog, err := r.store.Backlog(ctx)
	require.NoError(t, err)
	require.Zero(t, backlog[job.PriorityNormal], "a failed job counts toward no backlog")
}

func TestOneReconcilerIsActive(t *testing.T) {
	t.Parallel()
	pool := testsvc.Postgres(t)
	st := store.New(pool)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	type replica struct {
		reg    *prometheus.Registry
		cancel context.CancelFunc
		done   chan error
	}
	start := func() *replica {
		rp := &replica{reg: prometheus.NewRegistry(), done: make(chan error, 1)}
		rec, err := reconcile.New(reconcile.Config{Interval: 50 * time.Millisecond},
			reconcile.Deps{Store: st, Lanes: mem.Publisher(), Depth: mem.Inspector(), Registerer: rp.reg})
		require.NoError(t, err)
		var ctx context.Context
		ctx, rp.cancel = context.WithCancel(context.Background())
		go func() { rp.done <- rec.Run(ctx) }()
		return rp
	}
	active := func(rp *replica) bool {
		mfs, err := rp.reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "llmq_reconciler_active" {
				return mf.GetMetric()[0].GetGauge().GetValue() == 1
			}
		}
		return false
	}
	a, b := start(), start()
	deadline := time.Now().Add(20 * time.Second)
	for !active(a) && !active(b) {
		require.True(t, time.Now().Before(deadline), "no reconciler became active")
		time.Sleep(20 * time.Millisecond)
	}
	first, second := a, b
	if active(b) {
		first, second = b, a
	}
	require.False(t, active(second), "only one is active")
	first.cancel()
	require.NoError(t, <-first.done)
	for !active(second) {
		require.True(t, time.Now().Before(deadline), "the other did not take over")
		time.Sleep(20 * time.Millisecond)
	}
	second.cancel()
	require.NoError(t, <-second.done)
}

// countingStore counts the sweeps' looks for jobs without a message and
// for orphaned running jobs.
type countingStore struct {
	reconcile.Store
	unenqueued, orphaned atomic.Int32
}

func (c *countingStore) TakeUnenqueued(ctx context.Context, limit int) ([]store.Record, error) {
	c.unenqueued.Add(1)
	return c.Store.TakeUnenqueued(ctx, limit)
}

func (c *countingStore) TakeOrphaned(ctx context.Context, limit int) ([]store.Record, error) {
	c.orphaned.Add(1)
	return c.Store.TakeOrphaned(ctx, limit)
}

// The active reconciler looks for orphaned running jobs every OrphanEvery,
// not on every sweep (by default it does, every Interval).
func TestReconcilerLooksForOrphansEveryOrphanEvery(t *testing.T) {
	t.Parallel()
	pool := testsvc.Postgres(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	for _, every := range []time.Duration{0, time.Hour} {
		st := &countingStore{Store: store.New(pool)}
		rec, err := reconcile.New(reconcile.Config{Interval: 10 * time.Millisecond, OrphanEvery: every},
			reconcile.Deps{Store: st, Lanes: mem.Publisher(), Depth: mem.Inspector()})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- rec.Run(ctx) }()
		deadline := time.Now().Add(30 * time.Second)
		for st.unenqueued.Load() < 10 {
			require.True(t, time.Now().Before(deadline), "10 sweeps within 30s")
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		require.NoError(t, <-done)
		sweeps, looks := st.unenqueued.Load(), st.orphaned.Load()
		if every == 0 {
			assert.Equal(t, sweeps, looks, "by default every sweep looks")
		} else {
			assert.Equal(t, int32(1), looks, "OrphanEvery %v: only the first of %d sweeps looks", every, sweeps)
		}
	}
}

// An intake message the broker dead-lettered before it was stored was
// never judged by the ingester: the broker identity decides whose dead
// letter it is. A body claiming acme, which takes raw publishes only from
// its broker user, without that user is filed under the default tenant
// with the rule as reason, never under acme (whose key could otherwise
// replay it as its own job); one acme's user published is acme's, whatever
// tenant its body names, and counts as stored when acme holds its job.
func TestReconcilerJudgesAnIntakeDeadLetterByItsPublisher(t *testing.T) {
	t.Parallel()
	r := newRig(t, reconcile.Config{Interval: 50 * time.Millisecond, LostAfter: time.Hour,
		BrokerUsers: map[string]string{"u_acme": "acme"}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.rec.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	res, err := r.store.InsertBatch(ctx, []job.Job{{Tenant: "acme", ID: "stored", Model: "qwen-plus", Priority: job.PriorityNormal,
		Request: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}]}`)}})
	require.NoError(t, err)
	require.True(t, res[0].Created)
	sub := r.mem.IntakeSubscriber()
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(ctx, job.PriorityNormal, 10)
	require.NoError(t, err)
	for _, m := range []broker.Message{
		{Body: []byte(`{"id":"forged","tenant":"acme","model":"qwen-plus"}`)},
		// The ingester's reader takes "tenant" alone; ReadKey, any case.
		{Body: []byte(`{"id":"cased","Tenant":"acme","model":"qwen-plus"}`)},
		{Body: []byte(`{"id":"mine","model":"qwen-plus"}`), UserID: "u_acme"},
		{Body: []byte(`{"id":"stored","model":"qwen-plus"}`), UserID: "u_acme"},
		{Body: []byte(`{"id": 9}`), UserID: "u_acme"},
	} {
		require.NoError(t, r.mem.Publisher().PublishIntake(ctx, job.PriorityNormal, m))
		require.NoError(t, (<-ch).DeadLetter(ctx, broker.DeadLetter{Reason: broker.ReasonDeliveryLimit}))
	}

	list := func(tenant string) []store.DeadLetterRow {
		dls, _, err := r.store.ListDeadLetters(ctx, tenant, "", 10)
		require.NoError(t, err)
		return dls
	}
	r.eventually("four dead letters recorded", func() bool { return len(list(job.DefaultTenant))+len(list("acme")) >= 4 })
	time.Sleep(200 * time.Millisecond) // the fifth had its chance
	byDefault, byAcme := list(job.DefaultTenant), list("acme")
	require.Len(t, byDefault, 2)
	for _, dl := range byDefault {
		assert.Empty(t, dl.JobID, "no id read under a tenant the publisher is not")
		assert.True(t, broker.RefusedByIdentity(dl.Reason), dl.Reason)
		assert.Contains(t, dl.Reason, "before it was stored")
	}
	require.Len(t, byAcme, 2, "acme's stored job needs no dead letter")
	bodies := map[string]store.DeadLetterRow{}
	for _, dl := range byAcme {
		assert.Equal(t, store.DeadLetterMessage, dl.Kind)
		bodies[string(dl.Body)] = dl
	}
	assert.Equal(t, "mine", bodies[`{"id":"mine","model":"qwen-plus"}`].JobID)
	assert.Contains(t, bodies[`{"id":"mine","model":"qwen-plus"}`].Reason, "before it was stored")
	assert.Contains(t, bodies, `{"id": 9}`, "an unreadable body its user sent is acme's")
}
