package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/store"
)

func share(v float64) *float64 { return &v }

// TestOverviewSumsLiveReplicas: the overview sums the live replicas' rows
// of a model, shows the most cautious controller state and each replica's
// share, skips a replica gone silent, and shows the models to an admin
// only.
func TestOverviewSumsLiveReplicas(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	require.NoError(t, h.store.PutReplicaSnapshots(ctx, []store.ReplicaSnapshot{
		{ReplicaID: "r1", Model: "qwen-plus", Strategy: "auto", ControllerState: "hold", RPMLimit: 1200, TPMLimit: 150000,
			RequestsPerSec: 6, TokensPerSec: 1500, RateLimitedPerSec: 0, InputRatio: 1.1, OutputMean: 200, CalibrationSamples: 100,
			InFlight: 3, ShareRequests: share(0.6), ShareTokens: share(0.6)},
		{ReplicaID: "r2", Model: "qwen-plus", Strategy: "auto", ControllerState: "drain", RPMLimit: 1200, TPMLimit: 150000,
			RequestsPerSec: 4, TokensPerSec: 1000, RateLimitedPerSec: 1, InputRatio: 1.3, OutputMean: 300, CalibrationSamples: 100,
			InFlight: 2, ShareRequests: share(0.4), ShareTokens: share(0.4)},
	}))
	require.NoError(t, h.store.PutReplicaSnapshots(ctx, []store.ReplicaSnapshot{
		{ReplicaID: "gone", Model: "qwen-plus", Strategy: "auto", RequestsPerSec: 100},
	}))
	_, err := h.pool.Exec(ctx, `UPDATE replica_snapshots SET updated_at = now() - interval '1 minute' WHERE replica_id = 'gone'`)
	require.NoError(t, err)
	require.NoError(t, api.RefreshOverview(h.srv, ctx))

	var o api.Overview
	r := h.do(http.MethodGet, "/v1/overview", keyAdmin, nil)
	require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
	r.json(t, &o)
	require.Len(t, o.Models, 1)
	m := o.Models[0]
	assert.Equal(t, "qwen-plus", m.Model)
	assert.InDelta(t, 10, m.RequestsPerSec, 1e-9, "r1 + r2; the silent replica is skipped")
	assert.InDelta(t, 2500, m.TokensPerSec, 1e-9)
	assert.InDelta(t, 1, m.RateLimitedPerSec, 1e-9)
	assert.Equal(t, "drain", m.ControllerState, "drain is more cautious than hold")
	assert.InDelta(t, 1.2, m.InputRatio, 1e-9)
	assert.Equal(t, 5, m.InFlight)
	assert.EqualValues(t, 1200, m.RPMLimit)
	require.Len(t, m.Replicas, 2)
	assert.Equal(t, []string{"r1", "r2"}, []string{m.Replicas[0].ReplicaID, m.Replicas[1].ReplicaID})
	assert.InDelta(t, 0.6, *m.Replicas[0].ShareRequests, 1e-9)
	require.Len(t, m.Series.T, 1)
	assert.InDelta(t, 10, m.Series.Requests[0], 1e-9)

	r = h.do(http.MethodGet, "/v1/overview", keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
	var tenant api.Overview
	r.json(t, &tenant)
	assert.Empty(t, tenant.Models, "a tenant key sees no model's load: it is every tenant's")
	assert.Equal(t, "acme", tenant.Status.Tenant)
	for _, path := range []string{"/v1/overview", "/v1/overview/stream"} {
		assert.Equal(t, http.StatusUnauthorized, h.do(http.MethodGet, path, "", nil).Code)
		assert.Equal(t, http.StatusForbidden, h.do(http.MethodGet, path+"?tenant=globex", keyAcme, nil).Code)
		assert.Equal(t, http.StatusBadRequest, h.do(http.MethodGet, path+"?tenant=no!such", keyAdmin, nil).Code)
	}
}

// TestJobRequest: GET /v1/jobs/{id}/request gives the request as
// submitted, to the job's tenant and to an admin naming it; another
// tenant gets 404 as if the job did not exist.
func TestJobRequest(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "req-1").Code)
	var v api.JobRequestView
	r := h.do(http.MethodGet, "/v1/jobs/req-1/request", keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
	r.json(t, &v)
	assert.Equal(t, "req-1", v.ID)
	assert.Equal(t, "acme", v.Tenant)
	assert.JSONEq(t, `{"messages":[{"role":"user","content":"hello"}],"max_tokens":64}`, string(v.Request))
	assert.Equal(t, http.StatusOK, h.do(http.MethodGet, "/v1/jobs/req-1/request?tenant=acme", keyAdmin, nil).Code)
	assert.Equal(t, http.StatusNotFound, h.do(http.MethodGet, "/v1/jobs/req-1/request", keyGlobex, nil).Code)
	assert.Equal(t, http.StatusNotFound, h.do(http.MethodGet, "/v1/jobs/req-1/request?tenant=acme", keyGlobex, nil).Code)
	assert.Equal(t, http.StatusUnauthorized, h.do(http.MethodGet, "/v1/jobs/req-1/request", "", nil).Code)
	assert.Equal(t, http.StatusBadRequest, h.do(http.MethodGet, "/v1/jobs/req-1/request?tenant=no!such", keyAdmin, nil).Code)
}

// TestOverviewStream: GET /v1/overview/stream sends the overview as
// server-sent events, the first at once and more while the client stays.
func TestOverviewStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.http.URL+"/v1/overview/stream", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+keyAdmin)
	resp, err := h.http.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))

	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	events := 0
	var event string
	for events < 2 && sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			require.Equal(t, "overview", event)
			var o api.Overview
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &o))
			assert.Equal(t, api.StateOK, o.Status.State)
			assert.NotNil(t, o.Models)
			events++
		}
	}
	require.NoError(t, sc.Err())
	assert.Equal(t, 2, events, "the stream goes on after its first event")
}
