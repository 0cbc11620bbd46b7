package api_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// listed is the "tenant/id" of every job of a GET /v1/jobs answer.
func listed(t *testing.T, h *harness, key, query string) []string {
	t.Helper()
	r := h.do("GET", "/v1/jobs?"+query, key, nil)
	require.Equal(t, http.StatusOK, r.Code, "%s: %s", query, r.Body)
	var list api.ListResponse
	r.json(t, &list)
	out := []string{}
	for _, j := range list.Jobs {
		out = append(out, j.Tenant+"/"+j.ID)
	}
	return out
}

func TestListFiltersAndEveryTenant(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	require.Equal(t, http.StatusAccepted, h.do("POST", "/v1/jobs", keyAcme,
		jobBody("a1", map[string]any{"metadata": map[string]any{"ticket": 4711}})).Code)
	require.Equal(t, http.StatusAccepted, h.do("POST", "/v1/jobs", keyGlobex,
		jobBody("g1", map[string]any{"metadata": map[string]any{"ticket": "4711"}})).Code)
	require.Equal(t, http.StatusAccepted, h.do("POST", "/v1/jobs", keyAcme,
		jobBody("a2", map[string]any{"metadata": map[string]any{"ticket": 1}})).Code)
	_, err := h.pool.Exec(context.Background(), `UPDATE jobs SET created_at = created_at + interval '1 hour' WHERE id = 'a2'`)
	require.NoError(t, err)

	// A tenant key sees its own; an admin every tenant with tenant=*.
	assert.Equal(t, []string{"acme/a1", "acme/a2"}, listed(t, h, keyAcme, ""))
	assert.ElementsMatch(t, []string{"acme/a1", "globex/g1", "acme/a2"}, listed(t, h, keyAdmin, "tenant=*"))
	assert.Equal(t, "acme/a2", listed(t, h, keyAdmin, "tenant=*&order=desc")[0])
	assert.ElementsMatch(t, []string{"acme/a1", "globex/g1"}, listed(t, h, keyAdmin, "tenant=*&meta=ticket:4711"))
	assert.Equal(t, []string{"acme/a1"}, listed(t, h, keyAcme, "meta=ticket:4711"))
	assert.Equal(t, []string{"globex/g1"}, listed(t, h, keyAdmin, "tenant=*&id=g1"))
	assert.Equal(t, []string{"acme/a2"}, listed(t, h, keyAcme,
		"created_after="+url.QueryEscape(time.Now().Add(30*time.Minute).Format(time.RFC3339))))
	assert.Empty(t, listed(t, h, keyAcme, "model=qwen-max"))
	assert.Equal(t, []string{"acme/a1", "acme/a2"}, listed(t, h, keyAcme, "model=qwen-plus&status=queued"))

	// A tenant key cannot name every tenant, nor may anyone outside the lists.
	for _, path := range []string{"/v1/jobs?tenant=*", "/v1/dlq?tenant=*"} {
		assert.Equal(t, http.StatusForbidden, h.do("GET", path, keyGlobex, nil).Code, path)
	}
	assert.Equal(t, http.StatusBadRequest, h.do("GET", "/v1/status?tenant=*", keyAdmin, nil).Code)
	assert.Equal(t, http.StatusBadRequest, h.do("GET", "/v1/jobs?tenant=*&ids=a1", keyAdmin, nil).Code)
	for _, q := range []string{"order=up", "meta=nocolon", "created_before=yesterday", "id=bad/id", "status=lost"} {
		r := h.do("GET", "/v1/jobs?"+q, keyAcme, nil)
		assert.Equal(t, http.StatusBadRequest, r.Code, q)
	}
	// A cursor is for the order it was read in.
	var page api.ListResponse
	h.do("GET", "/v1/jobs?limit=1", keyAcme, nil).json(t, &page)
	require.NotEmpty(t, page.NextCursor)
	r := h.do("GET", "/v1/jobs?limit=1&order=desc&cursor="+page.NextCursor, keyAcme, nil)
	assert.Equal(t, http.StatusBadRequest, r.Code)
}

func TestJobDetailShowsTheAttemptLog(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "timeline").Code)

	var doc api.JobView
	r := h.do("GET", "/v1/jobs/timeline", keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code)
	assert.Contains(t, string(r.Body), `"attempt_log":[]`, "present and empty before any attempt")

	key := job.Key{Tenant: "acme", ID: "timeline"}
	c, err := h.store.Claim(ctx, key, "w1", time.Minute)
	require.NoError(t, err)
	claimed := time.Now().Add(-2 * time.Second)
	res := store.Result{ModelUsed: "qwen-plus", Response: []byte(`{"choices": []}`), PromptTokens: 7, CompletionTokens: 3,
		Trace: store.Trace{ClaimedAt: claimed, CallStartedAt: claimed.Add(500 * time.Millisecond), CallEndedAt: claimed.Add(1500 * time.Millisecond), HTTPStatus: 200}}
	ok, err := h.store.Complete(ctx, c.AttemptOf("w1"), res)
	require.NoError(t, err)
	require.True(t, ok)

	h.do("GET", "/v1/jobs/timeline", keyAcme, nil).json(t, &doc)
	require.NotNil(t, doc.AttemptLog)
	log := *doc.AttemptLog
	require.Len(t, log, 1)
	assert.Equal(t, store.OutcomeSucceeded, log[0].Outcome)
	assert.Equal(t, 200, log[0].HTTPStatus)
	assert.Equal(t, 7, log[0].PromptTokens)
	require.NotNil(t, log[0].DurationMS)
	assert.EqualValues(t, 1000, *log[0].DurationMS)
	require.NotNil(t, log[0].AdmissionWaitMS)
	assert.EqualValues(t, 500, *log[0].AdmissionWaitMS)

	// Lists leave the log out; another tenant cannot reach it.
	r = h.do("GET", "/v1/jobs", keyAcme, nil)
	assert.NotContains(t, string(r.Body), "attempt_log")
	assert.Equal(t, http.StatusNotFound, h.do("GET", "/v1/jobs/timeline?tenant=acme", keyGlobex, nil).Code)
}

func TestReplayFilteredDeadLetters(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	for _, id := range []string{"d1", "d2", "d3"} {
		require.Equal(t, http.StatusAccepted, h.submit(keyAcme, id).Code)
		key := job.Key{Tenant: "acme", ID: id}
		c, err := h.store.Claim(ctx, key, "w1", time.Minute)
		require.NoError(t, err)
		reason := "attempts exhausted"
		if id == "d3" {
			reason = "deadline passed"
		}
		ok, err := h.store.MarkDeadLettered(ctx, c.AttemptOf("w1"), store.AttemptError{Kind: "server", Message: "boom"},
			store.DeadLetterRow{Tenant: "acme", JobID: id, Lane: "normal", Reason: reason, Body: []byte(`{}`)})
		require.NoError(t, err)
		require.True(t, ok)
	}
	// d2's job is no longer dead: its replay fails and it stays.
	_, err := h.pool.Exec(ctx, `UPDATE jobs SET status = 'cancelled' WHERE id = 'd2'`)
	require.NoError(t, err)

	var out api.ReplayFilteredResponse
	r := h.do("POST", "/v1/dlq/replay?dry_run=true&reason="+url.QueryEscape("attempts exhausted"), keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
	r.json(t, &out)
	assert.EqualValues(t, 2, out.Matched)
	assert.Empty(t, out.Replayed)
	assert.Equal(t, http.StatusForbidden, h.do("POST", "/v1/dlq/replay?tenant=acme", keyGlobex, nil).Code)
	for _, q := range []string{"dry_run=maybe", "failed_after=yesterday", "cursor=17"} {
		r := h.do("POST", "/v1/dlq/replay?"+q, keyAcme, nil)
		assert.Equal(t, http.StatusBadRequest, r.Code, q)
	}
	r = h.do("POST", "/v1/dlq/replay?dry_run=true&tenant=*", keyAdmin, nil)
	r.json(t, &out)
	assert.EqualValues(t, 3, out.Matched, "an admin counts every tenant's")

	r = h.do("POST", "/v1/dlq/replay?reason="+url.QueryEscape("attempts exhausted"), keyAcme, nil)
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	r.json(t, &out)
	assert.EqualValues(t, 2, out.Matched)
	require.Len(t, out.Replayed, 1)
	assert.Equal(t, "d1", out.Replayed[0].JobID)
	assert.Equal(t, job.StatusQueued, out.Replayed[0].Status)
	require.Len(t, out.Failed, 1)
	assert.Equal(t, "d2", out.Failed[0].JobID)
	assert.Equal(t, api.CodeConflict, out.Failed[0].Error.Code)
	assert.EqualValues(t, 1, out.Remaining)
	assert.Equal(t, job.StatusQueued, mustStatus(t, h, "d1"))
	assert.Equal(t, job.StatusDead, mustStatus(t, h, "d3"), "another reason is not replayed")

	var dlq api.DLQResponse
	h.do("GET", "/v1/dlq?reason="+url.QueryEscape("deadline passed"), keyAcme, nil).json(t, &dlq)
	require.Len(t, dlq.DeadLetters, 1)
	assert.Equal(t, "d3", dlq.DeadLetters[0].JobID)
}

func mustStatus(t *testing.T, h *harness, id string) job.Status {
	t.Helper()
	rec, err := h.store.Get(context.Background(), job.Key{Tenant: "acme", ID: id})
	require.NoError(t, err)
	return rec.Status
}
