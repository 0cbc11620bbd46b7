package ingest_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) {
	leakcheck.Main(m, leakcheck.LateCleanup()...)
}

// rig is an ingester on the in-memory broker and a real Postgres.
type rig struct {
	t     *testing.T
	store *store.Store
	mem   *memory.Broker
	pub   broker.Publisher
	lanes map[job.Priority]<-chan broker.Delivery
}

func newRig(t *testing.T, cfg ingest.Config) *rig {
	t.Helper()
	return newRigOn(t, cfg, store.New(testsvc.Postgres(t)))
}

func newRigOn(t *testing.T, cfg ingest.Config, st *store.Store) *rig {
	t.Helper()
	r := &rig{t: t, store: st, mem: memory.New(memory.Config{})}
	t.Cleanup(func() { r.mem.Close() })
	r.pub = r.mem.Publisher()
	runIngester(t, cfg, r.store, r.mem.IntakeSubscriber(), r.mem.Publisher())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sub := r.mem.Subscriber()
	t.Cleanup(func() { _ = sub.Close() })
	r.lanes = map[job.Priority]<-chan broker.Delivery{}
	for _, lane := range job.Priorities {
		ch, err := sub.Subscribe(ctx, lane, 10000)
		require.NoError(t, err)
		r.lanes[lane] = ch
	}
	return r
}

func (r *rig) publish(lane job.Priority, body string) {
	r.t.Helper()
	require.NoError(r.t, r.pub.PublishIntake(context.Background(), lane, broker.Message{Body: []byte(body)}))
}

// forwarded waits for n lane messages of lane and returns their bodies.
func (r *rig) forwarded(lane job.Priority, n int) []string {
	r.t.Helper()
	var out []string
	deadline := time.After(30 * time.Second)
	for len(out) < n {
		select {
		case d := <-r.lanes[lane]:
			out = append(out, string(d.Message().Body))
			require.NoError(r.t, d.Ack(context.Background()))
		case <-deadline:
			r.t.Fatalf("lane %s: %d of %d messages forwarded within 30s", lane, len(out), n)
		}
	}
	return out
}

// noneForwarded checks that nothing reaches the lanes while a sentinel job,
// published after everything else on lane, goes through.
func (r *rig) noneForwarded(lane job.Priority) {
	r.t.Helper()
	r.publish(lane, job1("sentinel", `"hi"`))
	got := r.forwarded(lane, 1)
	require.Contains(r.t, got[0], `"sentinel"`, "only the sentinel reaches the lane")
	for _, l := range job.Priorities {
		select {
		case d := <-r.lanes[l]:
			r.t.Fatalf("lane %s: unexpected message %s", l, d.Message().Body)
		default:
		}
	}
}

// waitRow waits until the job's row exists and returns it.
func (r *rig) waitRow(tenant, id string) store.Record {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, err := r.store.Get(context.Background(), job.Key{Tenant: tenant, ID: id})
		if err == nil {
			return rec
		}
		require.ErrorIs(r.t, err, store.ErrNotFound)
		if time.Now().After(deadline) {
			r.t.Fatalf("job %s/%s has no row within 30s", tenant, id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func job1(id, content string) string {
	return fmt.Sprintf(`{"id":%q,"model":"qwen-plus","request":{"messages":[{"role":"user","content":%s}],"max_tokens":16}}`, id, content)
}

func TestIngestStoresAndForwardsEveryJob(t *testing.T) {
	t.Parallel()
	r := newRig(t, ingest.Config{})
	for i := range 300 {
		lane := job.Priorities[i%3]
		r.publish(lane, job1(fmt.Sprintf("j-%d", i), fmt.Sprintf(`"q%d"`, i)))
	}
	// No priority in the body: the routing lane is the job's priority.
	for _, lane := range job.Priorities {
		got := r.forwarded(lane, 100)
		require.Len(t, got, 100)
	}
	for i := range 300 {
		rec := r.waitRow(job.DefaultTenant, fmt.Sprintf("j-%d", i))
		require.Equal(t, job.StatusQueued, rec.Status)
		require.Equal(t, job.Priorities[i%3], rec.Priority)
		require.NotNil(t, rec.EnqueuedAt)
		require.JSONEq(t, fmt.Sprintf(`{"messages":[{"role":"user","content":"q%d"}],"max_tokens":16}`, i), string(rec.Request))
	}
	depth, err := r.mem.Inspector().Depth(context.Background(), job.PriorityNormal)
	require.NoError(t, err)
	require.Zero(t, depth, "the lanes were drained by the test, the intake by the ingester")
}

func TestIngestRefusesWithAReasonUnderTheID(t *testing.T) {
	t.Parallel()
	policy := results.NewPolicy(config.Config{Tenants: map[string]config.Tenant{"acme": {
		WebhookSecret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
		WebhookHosts:  []string{"hooks.acme.example", "169.254.169.254"}, ResultTopics: []string{"acme.results"},
	}}})
	r := newRig(t, ingest.Config{Limits: job.Limits{MaxPayloadBytes: 4096},
		CheckModels: func(j *job.Job) error { return config.CheckJobModels(map[string]config.Model{"qwen-plus": {}}, j) }, CheckDestination: policy.Check})
	cases := []struct {
		name, tenant, id, body, reason string
	}{
		{"unknown model", "default", "u1", `{"id":"u1","model":"gpt-9","request":{"messages":[{"role":"user","content":"a"}]}}`, "not a configured model"},
		{"unknown fallback", "acme", "u2", `{"id":"u2","tenant":"acme","model":"qwen-plus","fallback_models":["nope"],"request":{"messages":[{"role":"user","content":"a"}]}}`, "fallback_models[0]"},
		{"kind the model does not serve", "default", "k1", `{"id":"k1","model":"qwen-plus","kind":"embeddings","request":{"input":"a"}}`, `model: "qwen-plus" serves chat jobs, not embeddings jobs`},
		{"unknown kind", "default", "k2", `{"id":"k2","model":"qwen-plus","kind":"image","request":{"input":"a"}}`, "kind: must be one of chat, embeddings, task, audio"},
		{"wrong type", "default", "x2", `{"id":"x2","model":42,"request":{}}`, "model"},
		{"n over the cap", "default", "x7", `{"id":"x7","model":"qwen-plus","request":{"messages":[{"role":"user","content":"a"}],"n":9}}`, "request.n: must be a number at most 4"},
		{"store refused", "acme", "x8", `{"id":"x8","tenant":"acme","model":"qwen-plus","request":{"messages":[{"role":"user","content":"a"}],"store":true}}`, "request.store: is refused"},
		{"max_tokens", "default", "x5", `{"id":"x5","model":"qwen-plus","request":{"messages":[{"role":"user","content":"a"}],"max_tokens":99999999}}`, "max_tokens"},
		{"unknown field", "default", "x6", `{"id":"x6","model":"qwen-plus","colour":"red","request":{"messages":[{"role":"user","content":"a"}]}}`, "unknown field"},
		{"metadata service callback", "acme", "d1", `{"id":"d1","tenant":"acme","model":"qwen-plus","callback_url":"https://169.254.169.254/latest","request":{"messages":[{"role":"user","content":"a"}]}}`, "callback_url: 169.254.169.254 is not a public address"},
		{"callback outside the allow-list", "acme", "d2", `{"id":"d2","tenant":"acme","model":"qwen-plus","callback_url":"https://evil.example/h","request":{"messages":[{"role":"user","content":"a"}]}}`, "callback_url: host \"evil.example\" is not one of"},
		{"result topic not listed", "acme", "d3", `{"id":"d3","tenant":"acme","model":"qwen-plus","result_topic":"globex.results","request":{"messages":[{"role":"user","content":"a"}]}}`, "result_topic:"},
		{"NUL in the request", "default", "n1", `{"id":"n1","model":"qwen-plus","request":{"messages":[{"role":"user","content":"a\u0000b"}]}}`, `request: must not contain the NUL character`},
		{"a lone surrogate in the request", "default", "n3", `{"id":"n3","model":"qwen-plus","request":{"messages":[{"role":"user","content":"a\ud800"}]}}`, `request: must not contain \ud800, a UTF-16 surrogate escape`},
		{"a number numeric cannot hold", "default", "n4", `{"id":"n4","model":"qwen-plus","request":{"messages":[{"role":"user","content":"a"}],"seed":1e999999}}`, `request: must not hold the number 1e999999`},
		{"NUL in the model", "default", "n5", `{"id":"n5","model":"q\u0000","request":{"messages":[{"role":"user","content":"a"}]}}`, "model"},
		{"NUL in the metadata", "default", "n2", `{"id":"n2","model":"qwen-plus","metadata":{"k":"\u0000"},"request":{"messages":[{"role":"user","content":"a"}]}}`, `metadata: must not contain the NUL character`},
		{"oversize", "default", "x4", `{"id":"x4","model":"qwen-plus","request":{"messages":[{"role":"user","content":"` + strings.Repeat("a", 5000) + `"}]}}`, "byte limit"},
	}
	for _, c := range cases {
		r.publish(job.PriorityLow, c.body)
	}
	r.publish(job.PriorityLow, `{"id":"x1",`)                        // unreadable: dead letter only
	r.publish(job.PriorityLow, `{"model":"qwen-plus","request":{}}`) // no id
	r.noneForwarded(job.PriorityLow)

	ctx := context.Background()
	for _, c := range cases {
		rec := r.waitRow(c.tenant, c.id)
		require.Equal(t, job.StatusFailed, rec.Status, c.name)
		require.NotEmpty(t, rec.Errors, c.name)
		assert.Contains(t, rec.Errors[0].Message, c.reason, c.name)
		assert.Equal(t, "invalid", rec.Errors[0].Kind, c.name)
		dls, _, err := r.store.ListDeadLetters(ctx, c.tenant, "", 100)
		require.NoError(t, err)
		found := false
		for _, dl := range dls {
			if dl.JobID == c.id {
				found = true
				assert.Equal(t, store.DeadLetterJob, dl.Kind, c.name)
				assert.Equal(t, c.body, string(dl.Body), "%s: body kept byte for byte", c.name)
				assert.Contains(t, dl.Reason, c.reason, c.name)
			}
		}
		assert.True(t, found, "%s: listed in the DLQ", c.name)
	}
	dls, _, err := r.store.ListDeadLetters(ctx, job.DefaultTenant, "", 100)
	require.NoError(t, err)
	var messages int
	for _, dl := range dls {
		if dl.Kind == store.DeadLetterMessage {
			messages++
			assert.Empty(t, dl.JobID)
		}
	}
	assert.Equal(t, 2, messages, "the two messages without a readable id are kept as messages")
	backlog, err := r.store.Backlog(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), backlog[job.PriorityLow]+backlog[job.PriorityNormal]+backlog[job.PriorityHigh],
		"refused jobs are terminal and count toward no backlog; only the sentinel does")
}

func TestIngestConflictNeverTouchesTheStoredJob(t *testing.T) {
	t.Parallel()
	r := newRig(t, ingest.Config{})
	ctx := context.Background()
	orig := job1("c1", `"original"`)
	r.publish(job.PriorityNormal, orig)
	r.forwarded(job.PriorityNormal, 1)
	stored := r.waitRow(job.DefaultTenant, "c1")

	// Another request, a malformed body, and a change of max_attempts under
	// the same id: dead letters, the row as it was.
	r.publish(job.PriorityNormal, job1("c1", `"swapped"`))
	r.publish(job.PriorityNormal, `{"id":"c1","model":"qwen-plus","request":"not an object"}`)
	r.publish(job.PriorityNormal, `{"id":"c1","model":"qwen-plus","max_attempts":9,"request":{"messages":[{"role":"user","content":"original"}],"max_tokens":16}}`)
	// The same job again, spelt differently (key order, spacing):
	// recognised, and forwarded again since it is still queued.
	r.publish(job.PriorityNormal, `{ "request": {"max_tokens": 16, "messages":[{"content":"original","role":"user"}]}, "model":"qwen-plus", "id":"c1" }`)
	got := r.forwarded(job.PriorityNormal, 1)
	require.Contains(t, got[0], `"c1"`)
	r.noneForwarded(job.PriorityNormal)

	rec, err := r.store.Get(ctx, job.Key{Tenant: job.DefaultTenant, ID: "c1"})
	require.NoError(t, err)
	require.JSONEq(t, string(stored.Request), string(rec.Request))
	require.Equal(t, stored.MaxAttempts, rec.MaxAttempts)
	require.Equal(t, job.StatusQueued, rec.Status)
	dls, _, err := r.store.ListDeadLetters(ctx, job.DefaultTenant, "", 100)
	require.NoError(t, err)
	var conflicts int
	for _, dl := range dls {
		if dl.JobID == "c1" {
			conflicts++
			assert.Equal(t, store.DeadLetterMessage, dl.Kind)
			assert.Contains(t, dl.Reason, store.ReasonConflict)
		}
	}
	require.Equal(t, 3, conflicts)
}

func testLogger() *slog.Logger {
	if os.Getenv("LLMQ_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}
