package api_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
)

// A message dead letter goes back to the intake under llmq's own broker
// identity, which vouches for no tenant: the ingester takes the body's.
// Tenant acme has a broker user and globex none; acme's publisher sends a
// body naming globex, which the identity rule files under acme. Replayed
// by acme's key, it would have become a job of globex's. The replay of a
// body whose tenant is not the dead letter's is refused; one whose tenant
// is goes out.
func TestReplayOfAMessageKeepsItsTenant(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withBrokerTenants("acme"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in, err := ingest.New(ingest.Config{BrokerUsers: map[string]string{"u_acme": "acme"}},
		ingest.Deps{Store: h.store, Intake: h.mem.IntakeSubscriber(), Lanes: h.mem.Publisher(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	defer func() { cancel(); <-done }()

	squat := `{"id":"squat","tenant":"globex","model":"qwen-plus","request":{"messages":[{"role":"user","content":"x"}],"max_tokens":16}}`
	require.NoError(t, h.pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{UserID: "u_acme", Body: []byte(squat)}))
	unreadable := `{"id": 7, "tenant": "acme"}`
	require.NoError(t, h.pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{UserID: "u_acme", Body: []byte(unreadable)}))
	// Its publisher's identity named the tenant: the body need not.
	nameless := `{"id": 8}`
	require.NoError(t, h.pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{UserID: "u_acme", Body: []byte(nameless)}))
	var dls []store.DeadLetterRow
	require.Eventually(t, func() bool {
		dls, _, err = h.store.ListDeadLetters(ctx, "acme", "", 10)
		return err == nil && len(dls) == 3
	}, 10*time.Second, 20*time.Millisecond)
	byBody := map[string]int64{}
	for _, dl := range dls {
		byBody[string(dl.Body)] = dl.ID
	}

	r := h.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay", byBody[squat]), keyAcme, nil)
	require.Equal(t, http.StatusConflict, r.Code, "%s", r.Body)
	assert.Contains(t, r.apiError(t).Error.Message, `names tenant "globex"`)
	r = h.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay?tenant=acme", byBody[squat]), keyAdmin, nil)
	assert.Equal(t, http.StatusConflict, r.Code, "nor by an admin: %s", r.Body)

	// Over a broker that cannot vouch for the tenant on a replay
	// (RabbitMQ), acme's message would be refused again by the identity
	// rule and filed under the default tenant: a body that is not a valid
	// job is refused here, and one naming another tenant.
	plain := newHarnessOn(t, h.pool, unvouched{h.mem.Publisher()}, h.mem.Inspector(), withBrokerTenants("acme"))
	r = plain.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay", byBody[unreadable]), keyAcme, nil)
	require.Equal(t, http.StatusConflict, r.Code, "%s", r.Body)
	assert.Contains(t, r.apiError(t).Error.Message, "broker users")
	r = plain.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay", byBody[squat]), keyAcme, nil)
	require.Equal(t, http.StatusConflict, r.Code, "%s", r.Body)
	assert.Contains(t, r.apiError(t).Error.Message, `names tenant "globex"`)
	// A valid job is submitted as acme's by the API, which acme's key
	// asked: the message past its delivery limit runs again.
	valid := `{"id":"again","model":"qwen-plus","request":{"messages":[{"role":"user","content":"x"}],"max_tokens":16}}`
	vid, err := h.store.RecordDeadLetter(ctx, store.DeadLetterRow{Kind: store.DeadLetterMessage, Tenant: "acme", JobID: "again",
		Lane: string(job.PriorityNormal), Reason: "delivery limit", Body: []byte(valid)})
	require.NoError(t, err)
	r = plain.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay", vid), keyAcme, nil)
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	rec, err := h.store.Get(ctx, job.Key{Tenant: "acme", ID: "again"})
	require.NoError(t, err, "stored as acme's job")
	assert.Equal(t, job.StatusQueued, rec.Status)
	_, err = h.store.GetDeadLetter(ctx, "acme", vid)
	require.ErrorIs(t, err, store.ErrNotFound, "the dead letter is removed")

	for _, body := range []string{unreadable, nameless} {
		r = h.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay", byBody[body]), keyAcme, nil)
		require.Equal(t, http.StatusAccepted, r.Code, "%s: %s", body, r.Body)
	}
	require.Eventually(t, func() bool {
		dls, _, err = h.store.ListDeadLetters(ctx, "acme", "", 10)
		if err != nil || len(dls) != 3 {
			return false
		}
		for _, dl := range dls {
			if dl.ID == byBody[unreadable] || dl.ID == byBody[nameless] {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "replayed, refused again, filed again under acme")

	time.Sleep(200 * time.Millisecond) // the ingester had its chance at the first message too
	_, err = h.store.Get(ctx, job.Key{Tenant: "globex", ID: "squat"})
	require.ErrorIs(t, err, store.ErrNotFound, "no job of globex's")
}

func withBrokerTenants(tenants ...string) harnessOpt {
	return func(c *api.Config) {
		c.BrokerTenants = map[string]bool{}
		for _, t := range tenants {
			c.BrokerTenants[t] = true
		}
	}
}

// unvouched is a publisher that cannot vouch for a tenant on the intake,
// as RabbitMQ's cannot.
type unvouched struct{ broker.Publisher }

// A replay submitted as the tenant's job stands on the tenant's broker
// user having published the message. A dead letter the identity rule
// refused was published by no such user, whichever tenant it is filed
// under (here the default tenant, which has broker users); one that reuses
// a stored job's id with another body is that job's conflict, not a job to
// run. Both stay where they are. The same body as the stored job finds it:
// 200, and the dead letter goes.
func TestReplayAsSubmissionRunsOnlyWhatABrokerUserSent(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withBrokerTenants("acme", job.DefaultTenant))
	plain := newHarnessOn(t, h.pool, unvouched{h.mem.Publisher()}, h.mem.Inspector(), withBrokerTenants("acme", job.DefaultTenant))
	ctx := context.Background()
	record := func(tenant, id, reason string, body []byte) int64 {
		t.Helper()
		dl, err := h.store.RecordDeadLetter(ctx, store.DeadLetterRow{Kind: store.DeadLetterMessage, Tenant: tenant, JobID: id,
			Lane: string(job.PriorityNormal), Reason: reason, Body: body})
		require.NoError(t, err)
		return dl
	}
	kept := func(tenant string, dl int64) {
		t.Helper()
		_, err := h.store.GetDeadLetter(ctx, tenant, dl)
		require.NoError(t, err, "the dead letter is kept")
	}

	forged := record(job.DefaultTenant, "", fmt.Sprintf(broker.ReasonIdentityRequired, job.DefaultTenant, job.DefaultTenant), jobBody("forged", nil))
	r := plain.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay?tenant=%s", forged, job.DefaultTenant), keyAdmin, nil)
	require.Equal(t, http.StatusConflict, r.Code, "%s", r.Body)
	assert.Contains(t, r.apiError(t).Error.Message, "vouched")
	// Nor over a broker that vouches for the tenant of its own intake (Kafka).
	r = h.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay?tenant=%s", forged, job.DefaultTenant), keyAdmin, nil)
	require.Equal(t, http.StatusConflict, r.Code, "%s", r.Body)
	kept(job.DefaultTenant, forged)
	_, err := h.store.Get(ctx, job.Key{Tenant: job.DefaultTenant, ID: "forged"})
	require.ErrorIs(t, err, store.ErrNotFound, "no job was submitted")

	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "twin").Code)
	other := record("acme", "twin", store.ReasonConflict, jobBody("twin", map[string]any{"max_attempts": 2}))
	r = plain.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay", other), keyAcme, nil)
	require.Equal(t, http.StatusConflict, r.Code, "%s", r.Body)
	assert.Contains(t, r.apiError(t).Error.Message, "another body")
	kept("acme", other)

	same := record("acme", "twin", "delivery limit", jobBody("twin", nil))
	r = plain.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay", same), keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code, "the stored job, not a new one: %s", r.Body)
	_, err = h.store.GetDeadLetter(ctx, "acme", same)
	require.ErrorIs(t, err, store.ErrNotFound, "the dead letter is removed")
	// A RabbitMQ message's reply_to and correlation_id may be properties,
	// which a dead letter does not keep: the stored job has them, the body
	// not, and it is still the same job.
	require.Equal(t, http.StatusAccepted, h.do(http.MethodPost, "/v1/jobs", keyAcme,
		jobBody("answered", map[string]any{"reply_to": "llmq.reply.acme.q", "correlation_id": "c-1"})).Code)
	bare := record("acme", "answered", "delivery limit", jobBody("answered", nil))
	r = plain.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay", bare), keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
	half := record("acme", "answered", "delivery limit", jobBody("answered", map[string]any{"reply_to": "llmq.reply.acme.q"}))
	r = plain.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay", half), keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code, "the correlation_id alone a property: %s", r.Body)

	// A submission, it waits for room as any: the tenant's backlog limit.
	full := newHarnessOn(t, h.pool, unvouched{h.mem.Publisher()}, h.mem.Inspector(), withBrokerTenants("acme"),
		withBacklogLimits(map[string]int64{"acme": 1}))
	require.Equal(t, http.StatusAccepted, full.submit(keyAcme, "room").Code)
	waits := record("acme", "waits", "delivery limit", jobBody("waits", nil))
	r = full.do(http.MethodPost, fmt.Sprintf("/v1/dlq/%d/replay", waits), keyAcme, nil)
	require.Equal(t, http.StatusTooManyRequests, r.Code, "%s", r.Body)
	kept("acme", waits)
}

// A message dead letter submitted as its tenant's job carries the replay's
// trace, as a submission carries its request's: the job's later spans join
// the trace of whoever replayed it.
func TestReplayAsSubmissionCarriesTheTrace(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h := newHarness(t)
	traced := newHarnessOn(t, h.pool, unvouched{h.mem.Publisher()}, h.mem.Inspector(), withBrokerTenants("acme"),
		func(c *api.Config) { c.Tracer = telemetry.New(tp) })
	ctx := context.Background()
	dl, err := h.store.RecordDeadLetter(ctx, store.DeadLetterRow{Kind: store.DeadLetterMessage, Tenant: "acme", JobID: "traced",
		Lane: string(job.PriorityNormal), Reason: "delivery limit", Body: jobBody("traced", nil)})
	require.NoError(t, err)

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, err := http.NewRequest(http.MethodPost, traced.http.URL+fmt.Sprintf("/v1/dlq/%d/replay", dl), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+keyAcme)
	req.Header.Set("Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := traced.http.Client().Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusAccepted, resp.StatusCode)

	rec, err := h.store.Get(ctx, job.Key{Tenant: "acme", ID: "traced"})
	require.NoError(t, err)
	assert.Contains(t, rec.TraceParent, traceID, "the replay's trace")
	require.NotEmpty(t, exp.GetSpans())
	assert.Equal(t, telemetry.SpanReplay, exp.GetSpans()[0].Name)
}
