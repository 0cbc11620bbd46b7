package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/finished"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

const signalWait = 10 * time.Second

// relayEvents publishes the outbox's events as a consumer's relay does,
// which notifies the listeners of the jobs it published.
func relayEvents(t *testing.T, s *store.Store) {
	t.Helper()
	b := memory.New(memory.Config{})
	defer b.Close()
	n, err := results.NewRelay(results.RelayParams{Store: s, Publisher: b.Publisher()}).Drain(context.Background())
	require.NoError(t, err)
	require.NotZero(t, n, "an event was waiting in the outbox")
}

// gate is the server's job-finished listener, a real one on the test's
// database, that also tells the test when a long-poll has registered and
// can pin the drain rate.
type gate struct {
	*finished.Listener
	registered chan job.Key
	rate       float64 // < 0: the listener's own
}

func (g *gate) Register(key job.Key) *finished.Waiter {
	w := g.Listener.Register(key)
	g.registered <- key
	return w
}

func (g *gate) DrainRate(lane job.Priority) float64 {
	if g.rate >= 0 {
		return g.rate
	}
	return g.Listener.DrainRate(lane)
}

// newWaitHarness is newHarness with a job-finished listener.
func newWaitHarness(t *testing.T, rate float64, opts ...harnessOpt) (*harness, *gate) {
	t.Helper()
	pool := testsvc.Postgres(t)
	l, err := finished.New(finished.Config{Connect: func(ctx context.Context) (*pgx.Conn, error) {
		return pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	}})
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
	g := &gate{Listener: l, registered: make(chan job.Key, 64), rate: rate}
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	h := newHarnessOn(t, pool, mem.Publisher(), mem.Inspector(), append(opts, func(c *api.Config) { c.Finished = g })...)
	h.mem = mem
	return h, g
}

func (g *gate) awaitRegistered(t *testing.T, want job.Key) {
	t.Helper()
	select {
	case key := <-g.registered:
		require.Equal(t, want, key)
	case <-time.After(signalWait):
		t.Fatalf("no long-poll registered for %v", want)
	}
}

// TestLongPollAnswersWhenTheJobFinishes: a long-poll registered on a
// queued job answers with the finished job as soon as it finishes.
func TestLongPollAnswersWhenTheJobFinishes(t *testing.T) {
	t.Parallel()
	h, g := newWaitHarness(t, -1)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "lp-1").Code)
	key := job.Key{Tenant: "acme", ID: "lp-1"}

	answer := make(chan response, 1)
	go func() { answer <- h.do("GET", "/v1/jobs/lp-1?wait=30s", keyAcme, nil) }()
	g.awaitRegistered(t, key)
	_, err := h.store.Cancel(context.Background(), key)
	require.NoError(t, err)
	relayEvents(t, h.store)
	select {
	case r := <-answer:
		require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
		var v api.JobView
		r.json(t, &v)
		assert.Equal(t, job.StatusCancelled, v.Status)
		assert.NotEmpty(t, r.Header.Get(api.HeaderWaited))
	case <-time.After(signalWait):
		t.Fatal("the long-poll did not answer when its job finished")
	}

	// A finished job answers at once, whatever the wait.
	r := h.do("GET", "/v1/jobs/lp-1?wait=60s", keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code)
	g.awaitRegistered(t, key)
}

// TestLongPollTimesOut: at the end of the wait the job is answered as it is.
func TestLongPollTimesOut(t *testing.T) {
	t.Parallel()
	h, g := newWaitHarness(t, -1)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "lp-2").Code)
	// Another tenant's finish of the same id does not wake it.
	require.Equal(t, http.StatusAccepted, h.submit(keyGlobex, "lp-2").Code)
	_, err := h.store.Cancel(context.Background(), job.Key{Tenant: "globex", ID: "lp-2"})
	require.NoError(t, err)

	r := h.do("GET", "/v1/jobs/lp-2?wait=300ms", keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code)
	g.awaitRegistered(t, job.Key{Tenant: "acme", ID: "lp-2"})
	var v api.JobView
	r.json(t, &v)
	assert.Equal(t, job.StatusQueued, v.Status)
	assert.NotEmpty(t, r.Header.Get(api.HeaderWaited))

	r = h.do("GET", "/v1/jobs/nope?wait=1", keyAcme, nil)
	assert.Equal(t, http.StatusNotFound, r.Code, "a missing job answers at once")
	g.awaitRegistered(t, job.Key{Tenant: "acme", ID: "nope"})
}

// TestLongPollClientGone: a long-poll whose client leaves stops waiting.
func TestLongPollClientGone(t *testing.T) {
	t.Parallel()
	h, g := newWaitHarness(t, -1)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "lp-3").Code)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", h.http.URL+"/v1/jobs/lp-3?wait=60s", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+keyAcme)
	done := make(chan error, 1)
	go func() {
		resp, err := h.http.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	g.awaitRegistered(t, job.Key{Tenant: "acme", ID: "lp-3"})
	cancel()
	require.Error(t, <-done)
	// A handler that kept waiting would hold the test server's Close at
	// cleanup for the whole minute.
}

func TestWaitIsValidated(t *testing.T) {
	t.Parallel()
	h, _ := newWaitHarness(t, -1)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "lp-4").Code)
	for _, bad := range []string{"61s", "-1s", "soon", "1h"} {
		r := h.do("GET", "/v1/jobs/lp-4?wait="+bad, keyAcme, nil)
		require.Equal(t, http.StatusBadRequest, r.Code, bad)
		assert.Equal(t, "wait", r.apiError(t).Error.Field, bad)
	}
	r := h.do("GET", "/v1/jobs/lp-4?wait=0s", keyAcme, nil)
	assert.Equal(t, http.StatusOK, r.Code)
	assert.Empty(t, r.Header.Get(api.HeaderWaited), "no wait asked")
}

// TestWaitWithoutListenerAnswersAtOnce: a server built without a listener
// takes ?wait= and answers at once.
func TestWaitWithoutListenerAnswersAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "lp-5").Code)
	r := h.do("GET", "/v1/jobs/lp-5?wait=60s", keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code)
	assert.Empty(t, r.Header.Get(api.HeaderWaited))
}

// TestExpectedStart: a queued job's document says when it should start,
// from the jobs queued ahead of it in its lane and the lane's drain rate.
func TestExpectedStart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	h, g := newWaitHarness(t, 2, func(c *api.Config) { c.Now = func() time.Time { return now } })
	for i := range 5 {
		require.Equal(t, http.StatusAccepted, h.submit(keyAcme, fmt.Sprintf("es-%d", i)).Code)
	}
	require.Equal(t, http.StatusAccepted, h.do("POST", "/v1/jobs", keyGlobex, jobBody("es-g", nil)).Code)
	require.Equal(t, http.StatusAccepted, h.do("POST", "/v1/jobs", keyAcme, jobBody("es-high", map[string]any{"priority": "high"})).Code)
	_, err := h.store.Cancel(context.Background(), job.Key{Tenant: "acme", ID: "es-0"})
	require.NoError(t, err)

	get := func(key, id string) api.JobView {
		t.Helper()
		r := h.do("GET", "/v1/jobs/"+id, key, nil)
		require.Equal(t, http.StatusOK, r.Code)
		var v api.JobView
		r.json(t, &v)
		return v
	}
	v := get(keyGlobex, "es-g")
	require.NotNil(t, v.ExpectedStartAt)
	assert.Equal(t, now.Add(2*time.Second), *v.ExpectedStartAt, "es-1..es-4 ahead (of any tenant), at 2 jobs/s")
	v = get(keyAcme, "es-1")
	require.NotNil(t, v.ExpectedStartAt)
	assert.Equal(t, now, *v.ExpectedStartAt, "nothing ahead")
	assert.Nil(t, get(keyAcme, "es-0").ExpectedStartAt, "not queued")
	assert.Equal(t, now, *get(keyAcme, "es-high").ExpectedStartAt, "its own lane")

	g.rate = 0 // nothing drains: no estimate
	assert.Nil(t, get(keyGlobex, "es-g").ExpectedStartAt)
}

func TestGetMany(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		require.Equal(t, http.StatusAccepted, h.do("POST", "/v1/jobs", keyAcme, jobBody(id, map[string]any{"metadata": map[string]any{"n": id}})).Code)
	}
	require.Equal(t, http.StatusAccepted, h.submit(keyGlobex, "m-4").Code)
	r := h.do("GET", "/v1/jobs?ids=m-3,nope,m-1,m-4,bad%20id", keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code)
	var page api.ListResponse
	r.json(t, &page)
	require.Len(t, page.Jobs, 2)
	assert.Equal(t, "m-3", page.Jobs[0].ID)
	assert.JSONEq(t, `{"n": "m-3"}`, string(page.Jobs[0].Metadata))
	assert.Equal(t, "m-1", page.Jobs[1].ID)
	assert.Empty(t, page.NextCursor)

	ids := make([]string, 101)
	for i := range ids {
		ids[i] = fmt.Sprintf("x%d", i)
	}
	for _, q := range []string{"ids=" + strings.Join(ids, ","), "ids=m-1&status=queued"} {
		r = h.do("GET", "/v1/jobs?"+q, keyAcme, nil)
		require.Equal(t, http.StatusBadRequest, r.Code, q)
		assert.Equal(t, "ids", r.apiError(t).Error.Field)
	}
}

// TestFeed: GET /v1/jobs?finished_after= hands out each finish once, in
// order, with a cursor always to continue from.
func TestFeed(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i := range 4 {
		require.Equal(t, http.StatusAccepted, h.do("POST", "/v1/jobs", keyAcme, jobBody(fmt.Sprintf("f-%d", i), map[string]any{"metadata": map[string]any{"i": i}})).Code)
	}
	feed := func(cursor, extra string) api.FeedResponse {
		t.Helper()
		r := h.do("GET", "/v1/jobs?finished_after="+cursor+extra, keyAcme, nil)
		require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
		var raw map[string]json.RawMessage
		r.json(t, &raw)
		require.Contains(t, raw, "next_cursor", "always present")
		var page api.FeedResponse
		r.json(t, &page)
		return page
	}
	empty := feed("", "")
	assert.Empty(t, empty.Jobs)
	for _, id := range []string{"f-2", "f-0", "f-3"} {
		_, err := h.store.Cancel(context.Background(), job.Key{Tenant: "acme", ID: id})
		require.NoError(t, err)
	}
	p1 := feed(empty.NextCursor, "&limit=2")
	require.Len(t, p1.Jobs, 2)
	assert.Equal(t, "f-2", p1.Jobs[0].ID)
	assert.NotEmpty(t, p1.Jobs[0].Metadata)
	assert.Equal(t, "f-0", p1.Jobs[1].ID)
	p2 := feed(p1.NextCursor, "&limit=2")
	require.Len(t, p2.Jobs, 1)
	assert.Equal(t, "f-3", p2.Jobs[0].ID)
	p3 := feed(p2.NextCursor, "")
	assert.Empty(t, p3.Jobs)
	assert.Equal(t, p2.NextCursor, p3.NextCursor, "nothing new: the same cursor")
	assert.Empty(t, feed("", "&status=succeeded,failed").Jobs)
	assert.Len(t, feed("", "&status=cancelled").Jobs, 3)

	for _, c := range []struct{ query, field string }{
		{"finished_after=garbage!", "finished_after"},
		{"finished_after=&status=queued", "status"},
		{"finished_after=&cursor=x", "cursor"},
		{"finished_after=&limit=0", "limit"},
	} {
		r := h.do("GET", "/v1/jobs?"+c.query, keyAcme, nil)
		require.Equal(t, http.StatusBadRequest, r.Code, c.query)
		assert.Equal(t, c.field, r.apiError(t).Error.Field, c.query)
	}
}

// TestDrainRateFromTheListener: with a job-finished listener, the status's
// drain rate is what the listener counts over every lane, not a scan of
// the jobs table (which holds no finished job here), and Retry-After
// follows it.
func TestDrainRateFromTheListener(t *testing.T) {
	t.Parallel()
	h, _ := newWaitHarness(t, 0.5, withLimits(0, 1))
	st := h.refresh()
	assert.InDelta(t, 1.5, st.DrainRate, 1e-9, "0.5 jobs/s on each of the three lanes")
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "dr-1").Code)
	h.refresh()
	r := h.submit(keyAcme, "dr-2")
	require.Equal(t, http.StatusTooManyRequests, r.Code)
	assert.Equal(t, "1", r.Header.Get("Retry-After"), "one job over the limit at 1.5 jobs/s")
}
