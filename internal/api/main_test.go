package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// TestMain runs the tests, then holds every answer the handlers gave
// during them to api/openapi.yaml (contractRun).
func TestMain(m *testing.M) {
	leakcheck.Main(contractRun{m})
}

// Keys of the two tenants every test uses.
const (
	keyAcme   = "acme-key-0123456789"
	keyGlobex = "globex-key-9876543210"
)

var testKeys = config.APIKeys{keyAcme: "acme", keyGlobex: "globex"}

// keyAdmin is an admin key (admin_keys): it acts for every tenant.
const keyAdmin = "admin-key-5555555555"

// harness is a Server over a fresh Postgres database and a broker, served
// by an httptest server.
type harness struct {
	t     *testing.T
	srv   *api.Server
	http  *httptest.Server
	store *store.Store
	pool  *pgxpool.Pool // the store's database, for raw SQL
	pub   broker.Publisher
	insp  broker.Inspector
	mem   *memory.Broker // set when the broker is the in-memory one
}

type harnessOpt func(*api.Config)

func withLimits(soft, hard int64) harnessOpt {
	return func(c *api.Config) { c.Backpressure.SoftLimit, c.Backpressure.HardLimit = soft, hard }
}

func withMaxPayload(n int) harnessOpt {
	return func(c *api.Config) { c.Limits.MaxPayloadBytes = n }
}

func withKeys(k config.APIKeys) harnessOpt {
	return func(c *api.Config) {
		c.APIKeys = k
		if len(k) == 0 {
			c.AdminKeys = nil // no keys at all: the loopback-only mode
		}
	}
}

func withBacklogLimits(limits map[string]int64) harnessOpt {
	return func(c *api.Config) { c.BacklogLimits = limits }
}

// newHarness serves the API over Postgres and the in-memory broker.
func newHarness(t *testing.T, opts ...harnessOpt) *harness {
	t.Helper()
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	h := newHarnessWith(t, mem.Publisher(), mem.Inspector(), opts...)
	h.mem = mem
	return h
}

func newHarnessWith(t *testing.T, pub broker.Publisher, insp broker.Inspector, opts ...harnessOpt) *harness {
	t.Helper()
	return newHarnessOn(t, testsvc.Postgres(t), pub, insp, opts...)
}

func newHarnessOn(t *testing.T, pool *pgxpool.Pool, pub broker.Publisher, insp broker.Inspector, opts ...harnessOpt) *harness {
	t.Helper()
	st := store.New(pool)
	cfg := api.Config{
		Store: st, Publisher: pub, Inspector: insp,
		APIKeys:      testKeys,
		AdminKeys:    []config.Secret{config.Secret(keyAdmin)},
		Backpressure: config.Backpressure{SoftLimit: 1000, HardLimit: 2000, StatusInterval: time.Second},
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := api.New(cfg)
	require.NoError(t, err)
	ts := newTestServer(t, srv)
	return &harness{t: t, srv: srv, http: ts, store: st, pool: pool, pub: pub, insp: insp}
}

type response struct {
	Code   int
	Header http.Header
	Body   []byte
}

func (r response) json(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(r.Body, v), "body: %s", r.Body)
}

type apiErr struct {
	Error   api.ErrorBody `json:"error"`
	Backlog *int64        `json:"backlog"`
}

func (r response) apiError(t *testing.T) apiErr {
	t.Helper()
	var e apiErr
	r.json(t, &e)
	return e
}

func (h *harness) do(method, path, key string, body []byte) response {
	h.t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, h.http.URL+path, bytes.NewReader(body))
	require.NoError(h.t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.http.Client().Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	return response{Code: resp.StatusCode, Header: resp.Header, Body: data}
}

// jobBody returns a valid job with id (omitted when "") and any overrides.
func jobBody(id string, over map[string]any) []byte {
	j := map[string]any{
		"model":   "qwen-plus",
		"request": map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hello"}}, "max_tokens": 64},
	}
	if id != "" {
		j["id"] = id
	}
	for k, v := range over {
		if v == nil {
			delete(j, k)
			continue
		}
		j[k] = v
	}
	b, _ := json.Marshal(j)
	return b
}

func (h *harness) submit(key, id string) response {
	h.t.Helper()
	return h.do(http.MethodPost, "/v1/jobs", key, jobBody(id, nil))
}

func (h *harness) depth(lane job.Priority) int64 {
	h.t.Helper()
	n, err := h.insp.Depth(context.Background(), lane)
	require.NoError(h.t, err)
	return n
}

func (h *harness) refresh() api.Status {
	h.t.Helper()
	st, err := h.srv.RefreshStatus(context.Background())
	require.NoError(h.t, err)
	return st
}
