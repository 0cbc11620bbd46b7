package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/finished"
	"github.com/llmq/llmq/internal/job"
)

// fakeFinished reports fixed drain rates; it wakes no long-poll (the tests
// using it never wait).
type fakeFinished struct {
	lane    float64
	tenants map[string]float64
}

func (f fakeFinished) Register(job.Key) *finished.Waiter    { panic("no long-poll in this test") }
func (f fakeFinished) DrainRate(job.Priority) float64       { return f.lane }
func (f fakeFinished) TenantDrainRates() map[string]float64 { return f.tenants }

func withFinished(f api.Finished) harnessOpt {
	return func(c *api.Config) { c.Finished = f }
}

// TestTenantBacklogLimit: the flooding tenant gets 429 from its own
// backlog_limit, before and after the backlog is measured, while another
// tenant is still accepted and the global limit is far off. Over RabbitMQ:
// a refused job is neither stored nor published.
func TestTenantBacklogLimit(t *testing.T) {
	t.Parallel()
	h, cfg := newRabbitHarness(t, withBacklogLimits(map[string]int64{"acme": 3, "globex": 100}))
	ctx := context.Background()
	statuses := subscribeStatus(t, cfg)
	for i := range 3 {
		r := h.submit(keyAcme, fmt.Sprintf("flood-%d", i))
		require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	}
	check := func(when string) {
		t.Helper()
		r := h.submit(keyAcme, "flood-over")
		require.Equal(t, http.StatusTooManyRequests, r.Code, "%s: %s", when, r.Body)
		e := r.apiError(t)
		assert.Equal(t, api.CodeBackpressure, e.Error.Code)
		assert.Contains(t, e.Error.Message, "backlog_limit (3)", when)
		require.NotNil(t, e.Backlog)
		assert.EqualValues(t, 3, *e.Backlog, "%s: the tenant's backlog, not the global one", when)
		assert.NotEmpty(t, r.Header.Get("Retry-After"), when)
		// The other tenant is accepted meanwhile.
		r = h.submit(keyGlobex, "steady-"+when)
		require.Equal(t, http.StatusAccepted, r.Code, "%s: %s", when, r.Body)
	}
	check("admitted")
	st := h.refresh()
	assert.Equal(t, api.StateOK, st.State, "the global backlog is far from its limits")
	assert.Equal(t, map[string]string{"acme": api.StateFull, "globex": api.StateOK}, st.TenantStates)
	check("measured")
	// A producer publishing raw learns it on llmq.status.
	select {
	case d := <-statuses:
		var doc map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(d.Body, &doc))
		assert.JSONEq(t, `{"acme":"full","globex":"ok"}`, string(doc["tenant_states"]))
		assert.NotContains(t, doc, "tenants")
	case <-time.After(10 * time.Second):
		t.Fatal("no llmq.status message after acme's state changed")
	}

	_, err := h.store.Get(ctx, job.Key{Tenant: "acme", ID: "flood-over"})
	assert.Error(t, err, "the refused job is not stored")
	assert.EqualValues(t, 5, h.depth(job.PriorityNormal), "3 of acme's and 2 of globex's published, the refused one not")

	// A batch entirely over the tenant's limit is a 429 of the tenant's.
	r := h.do("POST", "/v1/jobs:batch", keyAcme, []byte(`[`+string(jobBody("b1", nil))+`,`+string(jobBody("b2", nil))+`]`))
	require.Equal(t, http.StatusTooManyRequests, r.Code, "%s", r.Body)
	assert.Contains(t, r.apiError(t).Error.Message, "backlog_limit")
	assert.NotEmpty(t, r.Header.Get("Retry-After"))

	// Room again once a job finishes.
	_, err = h.store.Cancel(ctx, job.Key{Tenant: "acme", ID: "flood-0"})
	require.NoError(t, err)
	h.refresh()
	assert.Equal(t, http.StatusAccepted, h.submit(keyAcme, "flood-over").Code)
}

// TestTenantRetryAfterFollowsItsOwnDrainRate: two tenants over their
// limits by as much get Retry-After from their own drain rates, not the
// global one.
func TestTenantRetryAfterFollowsItsOwnDrainRate(t *testing.T) {
	t.Parallel()
	h := newHarness(t,
		withBacklogLimits(map[string]int64{"acme": 2, "globex": 2}),
		withFinished(fakeFinished{lane: 1, tenants: map[string]float64{"acme": 0.5, "globex": 0.1}}))
	for _, key := range []string{keyAcme, keyGlobex} {
		for i := range 2 {
			require.Equal(t, http.StatusAccepted, h.submit(key, fmt.Sprintf("j%d", i)).Code)
		}
	}
	h.refresh()
	for _, tc := range []struct {
		key  string
		want int
	}{
		{keyAcme, 2},    // one job over at 0.5 jobs/s
		{keyGlobex, 10}, // one job over at 0.1 jobs/s
	} {
		r := h.submit(tc.key, "over")
		require.Equal(t, http.StatusTooManyRequests, r.Code, "%s", r.Body)
		ra, err := strconv.Atoi(r.Header.Get("Retry-After"))
		require.NoError(t, err)
		assert.Equal(t, tc.want, ra, tc.key)
	}

	// Each tenant's status shows its own drain rate and expected drain time.
	var st api.Status
	h.do("GET", "/v1/status", keyGlobex, nil).json(t, &st)
	require.Contains(t, st.Tenants, "globex")
	g := st.Tenants["globex"]
	assert.InDelta(t, 0.1, g.DrainRate, 1e-9)
	require.NotNil(t, g.ETASeconds)
	assert.InDelta(t, 20, *g.ETASeconds, 1e-9, "2 jobs at 0.1 jobs/s")
	assert.Equal(t, api.StateFull, g.State)
	assert.EqualValues(t, 2, g.BacklogLimit)
}

// TestStatusRoles: a tenant key sees its own backlog and the global state,
// no other tenant's numbers; an admin sees the global document and every
// tenant's; llmq.status carries the tenants' states only.
func TestStatusRoles(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withLimits(100, 200), withBacklogLimits(map[string]int64{"acme": 2}))
	for i := range 2 {
		require.Equal(t, http.StatusAccepted, h.submit(keyAcme, fmt.Sprintf("a%d", i)).Code)
	}
	for i := range 5 {
		require.Equal(t, http.StatusAccepted, h.submit(keyGlobex, fmt.Sprintf("g%d", i)).Code)
	}
	h.refresh()

	r := h.do("GET", "/v1/status", keyGlobex, nil)
	require.Equal(t, http.StatusOK, r.Code)
	assert.NotContains(t, string(r.Body), "acme", "no trace of another tenant")
	var st api.Status
	r.json(t, &st)
	assert.Equal(t, "globex", st.Tenant)
	assert.Equal(t, api.StateOK, st.State)
	assert.EqualValues(t, 5, st.Total, "its own backlog, not the global 7")
	assert.EqualValues(t, 5, st.Backlog[job.PriorityNormal])
	assert.Equal(t, map[string]api.TenantStatus{"globex": {State: api.StateOK, Backlog: 5, ETASeconds: nil}}, st.Tenants)
	assert.Nil(t, st.TenantStates)

	var acme api.Status
	h.do("GET", "/v1/status", keyAcme, nil).json(t, &acme)
	assert.EqualValues(t, 2, acme.Total)
	assert.Equal(t, api.StateFull, acme.Tenants["acme"].State)
	assert.NotContains(t, acme.Tenants, "globex")

	// Naming another tenant is refused; naming one's own is fine.
	r = h.do("GET", "/v1/status?tenant=acme", keyGlobex, nil)
	assert.Equal(t, http.StatusForbidden, r.Code)
	assert.Equal(t, api.CodeForbidden, r.apiError(t).Error.Code)
	assert.Equal(t, http.StatusOK, h.do("GET", "/v1/status?tenant=globex", keyGlobex, nil).Code)

	// The admin sees everything.
	var all api.Status
	h.do("GET", "/v1/status", keyAdmin, nil).json(t, &all)
	assert.Empty(t, all.Tenant)
	assert.EqualValues(t, 7, all.Total)
	assert.EqualValues(t, 2, all.Tenants["acme"].Backlog)
	assert.EqualValues(t, 2, all.Tenants["acme"].BacklogLimit)
	assert.Equal(t, api.StateFull, all.Tenants["acme"].State)
	assert.EqualValues(t, 5, all.Tenants["globex"].Backlog)
	assert.Equal(t, map[string]string{"acme": api.StateFull}, all.TenantStates)
	// ... and one tenant's view on asking.
	var one api.Status
	h.do("GET", "/v1/status?tenant=globex", keyAdmin, nil).json(t, &one)
	assert.Equal(t, "globex", one.Tenant)
	assert.EqualValues(t, 5, one.Total)
	assert.NotContains(t, one.Tenants, "acme")

	// llmq.status: the global numbers and the tenants' states, no
	// tenant's numbers.
	statuses := h.mem.Statuses()
	require.NotEmpty(t, statuses, "the refresh that changed acme's state published")
	var pub map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(statuses[len(statuses)-1], &pub))
	assert.JSONEq(t, `{"acme":"full"}`, string(pub["tenant_states"]))
	assert.NotContains(t, pub, "tenants")
	assert.NotContains(t, pub, "tenant")
	assert.JSONEq(t, `7`, string(pub["total"]))

	r = h.do("GET", "/metrics", keyAdmin, nil)
	assert.Contains(t, string(r.Body), `llmq_tenant_backpressure_state{tenant="acme"} 2`)
	assert.NotContains(t, string(r.Body), `tenant="globex"`, "only tenants with a limit")
}

// TestTenantKeyCannotReachAnotherTenant: ?tenant= naming another tenant
// is a 404 exactly like a missing job on a route by id, and a 403
// elsewhere; an admin reads, lists and submits as any tenant.
func TestTenantKeyCannotReachAnotherTenant(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "secret").Code)
	missing := h.do("GET", "/v1/jobs/no-such-job", keyGlobex, nil)
	require.Equal(t, http.StatusNotFound, missing.Code)
	for _, path := range []string{"/v1/jobs/secret?tenant=acme", "/v1/jobs/secret"} {
		r := h.do("GET", path, keyGlobex, nil)
		assert.Equal(t, http.StatusNotFound, r.Code, path)
		assert.Equal(t, string(missing.Body), string(r.Body), path)
	}
	r := h.do("POST", "/v1/jobs/secret/cancel?tenant=acme", keyGlobex, nil)
	assert.Equal(t, http.StatusNotFound, r.Code)
	r = h.do("POST", "/v1/dlq/1/replay?tenant=acme", keyGlobex, nil)
	assert.Equal(t, http.StatusNotFound, r.Code)
	for _, path := range []string{"/v1/jobs?tenant=acme", "/v1/jobs?ids=secret&tenant=acme", "/v1/dlq?tenant=acme"} {
		r := h.do("GET", path, keyGlobex, nil)
		assert.Equal(t, http.StatusForbidden, r.Code, path)
		assert.NotContains(t, string(r.Body), "secret", path)
	}
	r = h.do("POST", "/v1/jobs?tenant=acme", keyGlobex, jobBody("x", nil))
	assert.Equal(t, http.StatusForbidden, r.Code)
	r = h.do("POST", "/v1/jobs:batch?tenant=acme", keyGlobex, []byte(`[`+string(jobBody("x", nil))+`]`))
	assert.Equal(t, http.StatusForbidden, r.Code)

	// The admin reads acme's job by naming the tenant; its own default
	// tenant is "default".
	assert.Equal(t, http.StatusNotFound, h.do("GET", "/v1/jobs/secret", keyAdmin, nil).Code)
	r = h.do("GET", "/v1/jobs/secret?tenant=acme", keyAdmin, nil)
	require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
	var list api.ListResponse
	h.do("GET", "/v1/jobs?tenant=acme", keyAdmin, nil).json(t, &list)
	require.Len(t, list.Jobs, 1)
	assert.Equal(t, "secret", list.Jobs[0].ID)
	assert.Equal(t, http.StatusOK, h.do("GET", "/v1/dlq?tenant=acme", keyAdmin, nil).Code)
	for _, req := range []struct{ method, path string }{
		{"GET", "/v1/jobs"}, {"GET", "/v1/status"}, {"POST", "/v1/jobs/secret/cancel"}, {"POST", "/v1/dlq/1/replay"},
	} {
		r = h.do(req.method, req.path+"?tenant=no.such", keyAdmin, nil)
		assert.Equal(t, http.StatusBadRequest, r.Code, "%s %s", req.method, req.path)
		assert.Equal(t, "tenant", r.apiError(t).Error.Field, "%s %s", req.method, req.path)
	}

	// The admin submits as the body's tenant, else as ?tenant=, else as
	// "default".
	ctx := context.Background()
	for _, tc := range []struct {
		path   string
		body   []byte
		tenant string
	}{
		{"/v1/jobs", jobBody("by-admin-1", map[string]any{"tenant": "globex"}), "globex"},
		{"/v1/jobs?tenant=acme", jobBody("by-admin-2", nil), "acme"},
		{"/v1/jobs", jobBody("by-admin-3", nil), job.DefaultTenant},
	} {
		r := h.do("POST", tc.path, keyAdmin, tc.body)
		require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
		var sub api.SubmitResponse
		r.json(t, &sub)
		rec, err := h.store.Get(ctx, job.Key{Tenant: tc.tenant, ID: sub.ID})
		require.NoError(t, err, tc.tenant)
		assert.Equal(t, tc.tenant, rec.Tenant)
	}
}

// TestMetricsNeedAnAdminKey: /metrics refuses no key and a tenant key,
// serves an admin key, and stays open in the loopback-only mode.
func TestMetricsNeedAnAdminKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.do("GET", "/metrics", "", nil)
	assert.Equal(t, http.StatusUnauthorized, r.Code)
	assert.Equal(t, `Bearer realm="llmq"`, r.Header.Get("WWW-Authenticate"))
	r = h.do("GET", "/metrics", keyAcme, nil)
	assert.Equal(t, http.StatusForbidden, r.Code)
	assert.Equal(t, api.CodeForbidden, r.apiError(t).Error.Code)
	assert.NotContains(t, string(r.Body), "llmq_")
	r = h.do("GET", "/metrics", keyAdmin, nil)
	assert.Equal(t, http.StatusOK, r.Code)
	assert.Contains(t, string(r.Body), "llmq_api_jobs_submitted_total")

	open := newHarness(t, withKeys(nil))
	assert.Equal(t, http.StatusOK, open.do("GET", "/metrics", "", nil).Code)
}

// subscribeStatus binds an exclusive queue to cfg's llmq.status exchange.
func subscribeStatus(t *testing.T, cfg rabbitmq.Config) <-chan amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(cfg.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "", cfg.Prefix+broker.StatusName, false, nil))
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	return deliveries
}
