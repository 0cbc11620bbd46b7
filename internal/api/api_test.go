package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

func TestAuth(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, tc := range []struct {
		name   string
		header string
		want   int
	}{
		{"no header", "", http.StatusUnauthorized},
		{"wrong key", "Bearer nope", http.StatusUnauthorized},
		{"key prefix", "Bearer " + keyAcme[:5], http.StatusUnauthorized},
		{"basic scheme", "Basic " + keyAcme, http.StatusUnauthorized},
		{"bearer only", "Bearer ", http.StatusUnauthorized},
		{"valid", "Bearer " + keyAcme, http.StatusOK},
		{"case-insensitive scheme", "bearer " + keyGlobex, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, h.http.URL+"/v1/status", nil)
			require.NoError(t, err)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			resp, err := h.http.Client().Do(req)
			require.NoError(t, err)
			var body apiErr
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			require.Equal(t, tc.want, resp.StatusCode)
			if tc.want == http.StatusUnauthorized {
				assert.Equal(t, api.CodeUnauthorized, body.Error.Code)
				assert.NotContains(t, body.Error.Message, keyAcme)
			}
		})
	}
	// Every /v1 route needs a key; health and metrics do not.
	for _, route := range []struct{ method, path string }{
		{"POST", "/v1/jobs"}, {"POST", "/v1/jobs:batch"}, {"GET", "/v1/jobs"}, {"GET", "/v1/jobs/x"},
		{"POST", "/v1/jobs/x/cancel"}, {"GET", "/v1/dlq"}, {"POST", "/v1/dlq/1/replay"}, {"POST", "/v1/dlq/replay"},
	} {
		assert.Equal(t, http.StatusUnauthorized, h.do(route.method, route.path, "", jobBody("a", nil)).Code, "%s %s", route.method, route.path)
	}
	assert.Equal(t, http.StatusOK, h.do("GET", "/healthz", "", nil).Code)
}

func TestUnauthenticatedLoopbackMode(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withKeys(nil))
	r := h.submit("", "open-1")
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	rec, err := h.store.Get(context.Background(), job.Key{Tenant: job.DefaultTenant, ID: "open-1"})
	require.NoError(t, err)
	assert.Equal(t, job.StatusQueued, rec.Status)

	require.NoError(t, api.CheckListenAddr("127.0.0.1:8080", nil))
	require.NoError(t, api.CheckListenAddr("[::1]:8080", nil))
	require.NoError(t, api.CheckListenAddr("localhost:8080", nil))
	require.Error(t, api.CheckListenAddr("0.0.0.0:8080", nil))
	require.Error(t, api.CheckListenAddr(":8080", nil))
	require.Error(t, api.CheckListenAddr("10.1.2.3:8080", nil))
	require.NoError(t, api.CheckListenAddr(":8080", testKeys))
}

func TestSubmitAndGet(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.do("POST", "/v1/jobs", keyAcme, jobBody("ticket-1", map[string]any{"priority": "high", "metadata": map[string]any{"ticket": 1}}))
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	var sub api.SubmitResponse
	r.json(t, &sub)
	assert.Equal(t, api.SubmitResponse{ID: "ticket-1", Status: job.StatusQueued}, sub)

	// The message is the normalized job with the tenant of the key, on its lane.
	require.EqualValues(t, 1, h.depth(job.PriorityHigh))
	sub2 := h.mem.Subscriber()
	defer sub2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := sub2.Subscribe(ctx, job.PriorityHigh, 1)
	require.NoError(t, err)
	d := <-ch
	msg := d.Message()
	require.NoError(t, d.Ack(ctx))
	assert.Equal(t, "ticket-1", msg.Key)
	// The lane message wakes a worker for the stored job: its key only.
	key, err := job.ReadKey(msg.Body)
	require.NoError(t, err)
	assert.Equal(t, job.Key{Tenant: "acme", ID: "ticket-1"}, key)
	stored, err := h.store.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, job.PriorityHigh, stored.Priority)
	assert.Equal(t, job.DefaultMaxAttempts, stored.MaxAttempts)

	r = h.do("GET", "/v1/jobs/ticket-1", keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code)
	var raw map[string]json.RawMessage
	r.json(t, &raw)
	for _, f := range []string{"id", "status", "model_used", "attempts", "response", "usage", "error", "created_at", "completed_at"} {
		assert.Contains(t, raw, f)
	}
	var v api.JobView
	r.json(t, &v)
	assert.Equal(t, job.StatusQueued, v.Status)
	assert.Nil(t, v.CompletedAt)

	// No id: one is generated.
	r = h.submit(keyAcme, "")
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	r.json(t, &sub)
	require.True(t, job.ValidID(sub.ID), sub.ID)
	require.Equal(t, http.StatusOK, h.do("GET", "/v1/jobs/"+sub.ID, keyAcme, nil).Code)

	// A result written by a consumer shows up with usage.
	ctx2 := context.Background()
	c, err := h.store.Claim(ctx2, job.Key{Tenant: "acme", ID: "ticket-1"}, "w1", time.Minute)
	require.NoError(t, err)
	ok, err := h.store.Complete(ctx2, c.AttemptOf("w1"), store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{"choices":[]}`), PromptTokens: 3, CompletionTokens: 4})
	require.NoError(t, err)
	require.True(t, ok)
	h.do("GET", "/v1/jobs/ticket-1", keyAcme, nil).json(t, &v)
	assert.Equal(t, job.StatusSucceeded, v.Status)
	require.NotNil(t, v.ModelUsed)
	assert.Equal(t, "qwen-plus", *v.ModelUsed)
	require.NotNil(t, v.Usage)
	assert.Equal(t, 7, v.Usage.TotalTokens)
	assert.JSONEq(t, `{"choices":[]}`, string(v.Response))
	assert.NotNil(t, v.CompletedAt)
}

func TestCrossTenantIsolation(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "shared-id").Code)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "acme-only").Code)

	missing := h.do("GET", "/v1/jobs/does-not-exist", keyGlobex, nil)
	require.Equal(t, http.StatusNotFound, missing.Code)
	for _, r := range []response{
		h.do("GET", "/v1/jobs/acme-only", keyGlobex, nil),
	} {
		assert.Equal(t, missing.Code, r.Code)
		assert.Equal(t, string(missing.Body), string(r.Body), "another tenant's job must look exactly like a missing one")
	}
	missingCancel := h.do("POST", "/v1/jobs/does-not-exist/cancel", keyGlobex, nil)
	otherCancel := h.do("POST", "/v1/jobs/acme-only/cancel", keyGlobex, nil)
	assert.Equal(t, http.StatusNotFound, otherCancel.Code)
	assert.Equal(t, string(missingCancel.Body), string(otherCancel.Body))
	rec, err := h.store.Get(ctx, job.Key{Tenant: "acme", ID: "acme-only"})
	require.NoError(t, err)
	assert.Equal(t, job.StatusQueued, rec.Status, "globex's cancel must not touch acme's job")

	// The same id under another tenant is another job: created, not "existing".
	r := h.submit(keyGlobex, "shared-id")
	assert.Equal(t, http.StatusAccepted, r.Code)

	// Lists show only the caller's jobs.
	var list api.ListResponse
	h.do("GET", "/v1/jobs", keyGlobex, nil).json(t, &list)
	require.Len(t, list.Jobs, 1)
	assert.Equal(t, "shared-id", list.Jobs[0].ID)

	// A body naming another tenant is rejected.
	r = h.do("POST", "/v1/jobs", keyGlobex, jobBody("x", map[string]any{"tenant": "acme"}))
	require.Equal(t, http.StatusBadRequest, r.Code)
	assert.Equal(t, "tenant", r.apiError(t).Error.Field)
	// Naming one's own tenant is fine.
	assert.Equal(t, http.StatusAccepted, h.do("POST", "/v1/jobs", keyGlobex, jobBody("y", map[string]any{"tenant": "globex"})).Code)

	// Dead letters: globex can neither see nor replay acme's.
	dlID := deadLetter(t, h, "acme", "acme-only")
	var dlq api.DLQResponse
	h.do("GET", "/v1/dlq", keyGlobex, nil).json(t, &dlq)
	assert.Empty(t, dlq.DeadLetters)
	missingReplay := h.do("POST", "/v1/dlq/999999/replay", keyGlobex, nil)
	otherReplay := h.do("POST", fmt.Sprintf("/v1/dlq/%d/replay", dlID), keyGlobex, nil)
	assert.Equal(t, http.StatusNotFound, otherReplay.Code)
	assert.Equal(t, string(missingReplay.Body), string(otherReplay.Body))
	rec, err = h.store.Get(ctx, job.Key{Tenant: "acme", ID: "acme-only"})
	require.NoError(t, err)
	assert.Equal(t, job.StatusDead, rec.Status)
}

// deadLetter plays a consumer that gives up on a queued job: claims it, marks
// it dead and records the dead letter with the original body. It returns the
// dead letter's id.
func deadLetter(t *testing.T, h *harness, tenant, id string) int64 {
	t.Helper()
	ctx := context.Background()
	key := job.Key{Tenant: tenant, ID: id}
	c, err := h.store.Claim(ctx, key, "worker-1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	ok, err := h.store.MarkDead(ctx, c.AttemptOf("worker-1"), store.AttemptError{Kind: "server", Message: "boom"})
	require.NoError(t, err)
	require.True(t, ok)
	body, err := json.Marshal(c.Record.Job)
	require.NoError(t, err)
	dl, err := h.store.RecordDeadLetter(ctx, store.DeadLetterRow{Tenant: tenant, JobID: id, Lane: string(c.Record.Priority), Reason: "attempts_exhausted", Attempts: c.Attempt, LastError: "boom", Body: body})
	require.NoError(t, err)
	return dl
}

func TestValidationNamesTheField(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	msgs := []any{map[string]any{"role": "user", "content": "hi"}}
	for _, tc := range []struct {
		name  string
		body  string
		field string
	}{
		{"id bad characters", string(jobBody("bad id!", nil)), "id"},
		{"id too long", string(jobBody(strings.Repeat("a", 129), nil)), "id"},
		{"id not a string", `{"id":5,"model":"m","request":{"messages":[{}]}}`, "id"},
		{"model missing", string(jobBody("a", map[string]any{"model": nil})), "model"},
		{"model bad", string(jobBody("a", map[string]any{"model": "no spaces"})), "model"},
		{"fallback bad", string(jobBody("a", map[string]any{"fallback_models": []string{"ok", "not ok"}})), "fallback_models[1]"},
		{"priority", string(jobBody("a", map[string]any{"priority": "urgent"})), "priority"},
		{"max_attempts zero is default, negative is not", string(jobBody("a", map[string]any{"max_attempts": -1})), "max_attempts"},
		{"max_attempts too large", string(jobBody("a", map[string]any{"max_attempts": 51})), "max_attempts"},
		{"deadline past", string(jobBody("a", map[string]any{"deadline": "2001-01-01T00:00:00Z"})), "deadline"},
		{"deadline format", string(jobBody("a", map[string]any{"deadline": "tomorrow"})), "deadline"},
		{"metadata not object", string(jobBody("a", map[string]any{"metadata": []int{1}})), "metadata"},
		{"request missing", string(jobBody("a", map[string]any{"request": nil})), "request"},
		{"request not object", string(jobBody("a", map[string]any{"request": "hi"})), "request"},
		{"messages empty", string(jobBody("a", map[string]any{"request": map[string]any{"messages": []any{}}})), "request.messages"},
		{"message not object", string(jobBody("a", map[string]any{"request": map[string]any{"messages": []any{"hi"}}})), "request.messages[0]"},
		{"max_tokens zero", string(jobBody("a", map[string]any{"request": map[string]any{"messages": msgs, "max_tokens": 0}})), "request.max_tokens"},
		{"max_tokens huge", string(jobBody("a", map[string]any{"request": map[string]any{"messages": msgs, "max_tokens": 1 << 30}})), "request.max_tokens"},
		{"n over the cap", string(jobBody("a", map[string]any{"request": map[string]any{"messages": msgs, "n": 5}})), "request.n"},
		{"enable_search refused", string(jobBody("a", map[string]any{"request": map[string]any{"messages": msgs, "enable_search": true}})), "request.enable_search"},
		{"unknown field", string(jobBody("a", map[string]any{"colour": "red"})), "colour"},
		{"tenant of another key", string(jobBody("a", map[string]any{"tenant": "globex"})), "tenant"},
		{"reply_to of another tenant", string(jobBody("a", map[string]any{"reply_to": "llmq.reply.globex.q"})), "reply_to"},
		{"reply_to into the lanes", string(jobBody("a", map[string]any{"reply_to": "llmq.lane.high"})), "reply_to"},
		{"reply_to prefix only", string(jobBody("a", map[string]any{"reply_to": "llmq.reply.acme."})), "reply_to"},
		{"correlation_id control characters", string(jobBody("a", map[string]any{"reply_to": "llmq.reply.acme.q", "correlation_id": "a\nb"})), "correlation_id"},
		{"callback_url not absolute", string(jobBody("a", map[string]any{"callback_url": "/hook"})), "callback_url"},
		{"callback_url scheme", string(jobBody("a", map[string]any{"callback_url": "ftp://hooks.example.com/x"})), "callback_url"},
		{"callback_url credentials", string(jobBody("a", map[string]any{"callback_url": "https://u:p@hooks.example.com/x"})), "callback_url"},
		{"result_topic bad", string(jobBody("a", map[string]any{"result_topic": "no spaces"})), "result_topic"},
		{"not JSON", `{"id":`, ""},
		{"not an object", `[1,2]`, ""},
		{"trailing data", string(jobBody("a", nil)) + `{}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do("POST", "/v1/jobs", keyAcme, []byte(tc.body))
			require.Equal(t, http.StatusBadRequest, r.Code, "%s", r.Body)
			e := r.apiError(t)
			assert.Equal(t, api.CodeInvalidJob, e.Error.Code)
			assert.Equal(t, tc.field, e.Error.Field)
			if tc.field != "" {
				assert.Contains(t, e.Error.Message, tc.field, "the message names the field")
			}
		})
	}
	assert.Zero(t, h.depth(job.PriorityNormal), "nothing invalid reaches the broker")
}

func TestIdempotentSubmission(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	r1 := h.submit(keyAcme, "same")
	require.Equal(t, http.StatusAccepted, r1.Code)
	// A second submission, even with a different body, returns the existing job.
	r2 := h.do("POST", "/v1/jobs", keyAcme, jobBody("same", map[string]any{"model": "other-model"}))
	require.Equal(t, http.StatusOK, r2.Code)
	var sub api.SubmitResponse
	r2.json(t, &sub)
	assert.Equal(t, api.SubmitResponse{ID: "same", Status: job.StatusQueued}, sub)
	rec, err := h.store.Get(ctx, job.Key{Tenant: "acme", ID: "same"})
	require.NoError(t, err)
	assert.Equal(t, "qwen-plus", rec.Model, "the existing job is unchanged")

	// Eight concurrent submissions of one new id: one row, one message.
	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range codes {
		wg.Go(func() { codes[i] = h.submit(keyAcme, "raced").Code })
	}
	wg.Wait()
	created := 0
	for _, c := range codes {
		require.Contains(t, []int{http.StatusAccepted, http.StatusOK}, c)
		if c == http.StatusAccepted {
			created++
		}
	}
	assert.Equal(t, 1, created)
	var list api.ListResponse
	h.do("GET", "/v1/jobs?limit=100", keyAcme, nil).json(t, &list)
	assert.Len(t, list.Jobs, 2)
	assert.EqualValues(t, 2, h.depth(job.PriorityNormal), "one message per job")
}

func TestBodyLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPayload(1024))
	big := jobBody("big", map[string]any{"metadata": map[string]any{"pad": strings.Repeat("x", 2000)}})
	r := h.do("POST", "/v1/jobs", keyAcme, big)
	require.Equal(t, http.StatusRequestEntityTooLarge, r.Code)
	assert.Equal(t, api.CodePayloadTooLarge, r.apiError(t).Error.Code)
	assert.Equal(t, http.StatusAccepted, h.submit(keyAcme, "small").Code)

	var items []json.RawMessage
	for i := range 40 {
		items = append(items, jobBody(fmt.Sprintf("b%d", i), map[string]any{"metadata": map[string]any{"pad": strings.Repeat("x", 600)}}))
	}
	batch, _ := json.Marshal(items)
	r = h.do("POST", "/v1/jobs:batch", keyAcme, batch)
	require.Equal(t, http.StatusRequestEntityTooLarge, r.Code)
	assert.Equal(t, api.CodePayloadTooLarge, r.apiError(t).Error.Code)
}

func TestBatchMixedItems(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "exists").Code)
	batch := fmt.Sprintf(`[%s, %s, %s, %s, %s, 7]`,
		jobBody("good-1", nil),
		jobBody("bad-model", map[string]any{"model": nil}),
		jobBody("exists", nil),
		jobBody("good-1", nil), // repeats item 0
		jobBody("", map[string]any{"priority": "low"}),
	)
	r := h.do("POST", "/v1/jobs:batch", keyAcme, []byte(batch))
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	var resp api.BatchResponse
	r.json(t, &resp)
	require.Len(t, resp.Results, 6)
	assert.Equal(t, 2, resp.Created)
	assert.Equal(t, 1, resp.Existing)
	assert.Equal(t, 3, resp.Rejected)
	res := resp.Results
	assert.Equal(t, http.StatusAccepted, res[0].HTTPStatus)
	assert.Equal(t, "good-1", res[0].ID)
	assert.Equal(t, http.StatusBadRequest, res[1].HTTPStatus)
	assert.Equal(t, "model", res[1].Error.Field)
	assert.Equal(t, http.StatusOK, res[2].HTTPStatus)
	assert.Equal(t, job.StatusQueued, res[2].Status)
	assert.Equal(t, "id", res[3].Error.Field)
	assert.Equal(t, http.StatusAccepted, res[4].HTTPStatus)
	assert.True(t, job.ValidID(res[4].ID))
	assert.Equal(t, http.StatusBadRequest, res[5].HTTPStatus)
	for i, it := range res {
		assert.Equal(t, i, it.Index)
	}
	assert.EqualValues(t, 2, h.depth(job.PriorityNormal))
	assert.EqualValues(t, 1, h.depth(job.PriorityLow))

	for _, body := range []string{`{}`, `[]`, `nope`} {
		r := h.do("POST", "/v1/jobs:batch", keyAcme, []byte(body))
		assert.Equal(t, http.StatusBadRequest, r.Code, body)
		assert.Equal(t, api.CodeInvalidRequest, r.apiError(t).Error.Code)
	}
}

func TestBrokerDownLeavesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	require.NoError(t, h.pub.Close())
	r := h.submit(keyAcme, "lost")
	require.Equal(t, http.StatusServiceUnavailable, r.Code, "%s", r.Body)
	assert.Equal(t, api.CodeBrokerUnavailable, r.apiError(t).Error.Code)
	assert.NotEmpty(t, r.Header.Get("Retry-After"))
	var body struct {
		ID string `json:"id"`
	}
	r.json(t, &body)
	assert.Equal(t, "lost", body.ID, "a 503 names the id to retry with")
	_, err := h.store.Get(context.Background(), job.Key{Tenant: "acme", ID: "lost"})
	require.ErrorIs(t, err, store.ErrNotFound, "nothing half-created")
	assert.Zero(t, h.depth(job.PriorityNormal))
}

func TestCancel(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "c1").Code)
	r := h.do("POST", "/v1/jobs/c1/cancel", keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
	var v api.JobView
	r.json(t, &v)
	assert.Equal(t, job.StatusCancelled, v.Status)
	r = h.do("POST", "/v1/jobs/c1/cancel", keyAcme, nil)
	require.Equal(t, http.StatusConflict, r.Code)
	assert.Equal(t, api.CodeConflict, r.apiError(t).Error.Code)
}

func TestListPagination(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i := range 5 {
		require.Equal(t, http.StatusAccepted, h.submit(keyAcme, fmt.Sprintf("p%d", i)).Code)
	}
	require.Equal(t, http.StatusOK, h.do("POST", "/v1/jobs/p3/cancel", keyAcme, nil).Code)
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5)
		var list api.ListResponse
		r := h.do("GET", "/v1/jobs?limit=2&cursor="+cursor, keyAcme, nil)
		require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
		r.json(t, &list)
		for _, j := range list.Jobs {
			require.False(t, seen[j.ID], "job %s listed twice", j.ID)
			seen[j.ID] = true
		}
		if list.NextCursor == "" {
			break
		}
		cursor = list.NextCursor
	}
	assert.Len(t, seen, 5)

	var list api.ListResponse
	h.do("GET", "/v1/jobs?status=cancelled", keyAcme, nil).json(t, &list)
	require.Len(t, list.Jobs, 1)
	assert.Equal(t, "p3", list.Jobs[0].ID)

	for _, q := range []string{"status=nope", "limit=0", "limit=x", "cursor=%25%25"} {
		r := h.do("GET", "/v1/jobs?"+q, keyAcme, nil)
		assert.Equal(t, http.StatusBadRequest, r.Code, q)
		assert.Equal(t, api.CodeInvalidRequest, r.apiError(t).Error.Code, q)
	}
}

func TestDLQReplay(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	require.Equal(t, http.StatusAccepted, h.do("POST", "/v1/jobs", keyAcme, jobBody("d1", map[string]any{"priority": "low"})).Code)
	drain(t, h, job.PriorityLow, 1)
	id := deadLetter(t, h, "acme", "d1")

	var dlq api.DLQResponse
	h.do("GET", "/v1/dlq", keyAcme, nil).json(t, &dlq)
	require.Len(t, dlq.DeadLetters, 1)
	dl := dlq.DeadLetters[0]
	assert.Equal(t, id, dl.ID)
	assert.Equal(t, "d1", dl.JobID)
	assert.Equal(t, "low", dl.Lane)
	assert.Equal(t, "attempts_exhausted", dl.Reason)
	require.NotEmpty(t, dl.Body)

	// Broker down: the replay is durable all the same (202): the job is
	// queued with no message, which the reconciler publishes.
	down := newHarnessWithStore(t, h)
	require.NoError(t, down.pub.Close())
	r := down.do("POST", fmt.Sprintf("/v1/dlq/%d/replay", id), keyAcme, nil)
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	rec, err := h.store.Get(ctx, job.Key{Tenant: "acme", ID: "d1"})
	require.NoError(t, err)
	assert.Equal(t, job.StatusQueued, rec.Status)
	assert.Nil(t, rec.EnqueuedAt, "no message yet")
	missing, err := h.store.Unenqueued(ctx, 10)
	require.NoError(t, err)
	require.Len(t, missing, 1, "the reconciler finds it")
	h.do("GET", "/v1/dlq", keyAcme, nil).json(t, &dlq)
	assert.Empty(t, dlq.DeadLetters)

	// Dead again, replayed with the broker up: the message goes out.
	c, err := h.store.Claim(ctx, rec.Key(), "worker-2", time.Minute)
	require.NoError(t, err)
	ok, err := h.store.MarkDeadLettered(ctx, c.AttemptOf("worker-2"), store.AttemptError{Kind: "server", Message: "boom"},
		store.DeadLetterRow{Tenant: "acme", JobID: "d1", Lane: "low", Reason: "attempts_exhausted", Body: []byte(`{}`)})
	require.NoError(t, err)
	require.True(t, ok)
	h.do("GET", "/v1/dlq", keyAcme, nil).json(t, &dlq)
	require.Len(t, dlq.DeadLetters, 1)
	id = dlq.DeadLetters[0].ID
	r = h.do("POST", fmt.Sprintf("/v1/dlq/%d/replay", id), keyAcme, nil)
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	var rr api.ReplayResponse
	r.json(t, &rr)
	assert.Equal(t, api.ReplayResponse{ID: id, JobID: "d1", Status: job.StatusQueued}, rr)
	rec, err = h.store.Get(ctx, job.Key{Tenant: "acme", ID: "d1"})
	require.NoError(t, err)
	assert.Equal(t, job.StatusQueued, rec.Status)
	assert.Zero(t, rec.Attempts)
	assert.NotNil(t, rec.EnqueuedAt)
	assert.EqualValues(t, 1, h.depth(job.PriorityLow), "the job's message is back on its lane")
	h.do("GET", "/v1/dlq", keyAcme, nil).json(t, &dlq)
	assert.Empty(t, dlq.DeadLetters)
	assert.Equal(t, http.StatusNotFound, h.do("POST", fmt.Sprintf("/v1/dlq/%d/replay", id), keyAcme, nil).Code)
	assert.Equal(t, http.StatusNotFound, h.do("POST", "/v1/dlq/abc/replay", keyAcme, nil).Code)
}

// newHarnessWithStore serves a second API over h's database and broker
// inspector but a publisher of its own (to close it).
func newHarnessWithStore(t *testing.T, h *harness) *harness {
	pub := h.mem.Publisher()
	srv, err := api.New(api.Config{Store: h.store, Publisher: pub, Inspector: h.insp, APIKeys: testKeys})
	require.NoError(t, err)
	h2 := *h
	h2.srv = srv
	h2.pub = pub
	h2.http = newTestServer(t, srv)
	return &h2
}

// drain consumes and acks n messages of the lane (a consumer's broker side).
func drain(t *testing.T, h *harness, lane job.Priority, n int) {
	t.Helper()
	sub := h.mem.Subscriber()
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, lane, n)
	require.NoError(t, err)
	for range n {
		select {
		case d := <-ch:
			require.NoError(t, d.Ack(ctx))
		case <-ctx.Done():
			t.Fatalf("drain %s: %v", lane, ctx.Err())
		}
	}
}

func TestBackpressure(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withLimits(1, 3))
	ctx := context.Background()
	for i := range 3 {
		require.Equal(t, http.StatusAccepted, h.submit(keyAcme, fmt.Sprintf("bp%d", i)).Code)
	}
	// Admission counts jobs accepted since the last refresh: no wait needed.
	r := h.submit(keyAcme, "bp3")
	require.Equal(t, http.StatusTooManyRequests, r.Code, "%s", r.Body)
	e := r.apiError(t)
	assert.Equal(t, api.CodeBackpressure, e.Error.Code)
	require.NotNil(t, e.Backlog)
	assert.EqualValues(t, 3, *e.Backlog)
	ra, err := strconv.Atoi(r.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.Equal(t, 30, ra, "nothing drains yet: the default delay")
	_, err = h.store.Get(ctx, job.Key{Tenant: "acme", ID: "bp3"})
	require.ErrorIs(t, err, store.ErrNotFound)

	st := h.refresh()
	assert.Equal(t, api.StateFull, st.State)
	assert.EqualValues(t, 3, st.Total)
	assert.EqualValues(t, 3, st.Backlog[job.PriorityNormal])
	assert.Nil(t, st.ETASeconds)
	var got api.Status
	h.do("GET", "/v1/status", keyAcme, nil).json(t, &got)
	assert.Equal(t, api.StateFull, got.State)
	assert.EqualValues(t, 1, got.SoftLimit)
	assert.EqualValues(t, 3, got.HardLimit)
	// The state change went out on llmq.status.
	statuses := h.mem.Statuses()
	require.NotEmpty(t, statuses)
	var published api.Status
	require.NoError(t, json.Unmarshal(statuses[len(statuses)-1], &published))
	assert.Equal(t, api.StateFull, published.State)

	// A re-submission of a held job is answered even while full.
	assert.Equal(t, http.StatusOK, h.submit(keyAcme, "bp0").Code)
	// Batches: every item refused → 429 too.
	r = h.do("POST", "/v1/jobs:batch", keyAcme, []byte("["+string(jobBody("bpb", nil))+"]"))
	assert.Equal(t, http.StatusTooManyRequests, r.Code)
	assert.NotEmpty(t, r.Header.Get("Retry-After"))

	// A consumer finishes one job: it leaves Postgres's backlog and the broker.
	require.Equal(t, http.StatusOK, h.do("POST", "/v1/jobs/bp0/cancel", keyAcme, nil).Code)
	drain(t, h, job.PriorityNormal, 1)
	st = h.refresh()
	assert.Equal(t, api.StateThrottled, st.State)
	assert.EqualValues(t, 2, st.Total)
	assert.InDelta(t, 1.0/60, st.DrainRate, 1e-9)
	require.NotNil(t, st.ETASeconds)
	assert.InDelta(t, 120, *st.ETASeconds, 0.1)

	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "bp3").Code, "recovered")
	r = h.submit(keyAcme, "bp4")
	require.Equal(t, http.StatusTooManyRequests, r.Code)
	ra, err = strconv.Atoi(r.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.Equal(t, 60, ra, "one job over the limit at 1 job/min drains in 60 s")
}

func TestObservabilityEndpoints(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "m1").Code)
	r := h.do("GET", "/readyz", "", nil)
	require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
	r = h.do("GET", "/metrics", keyAdmin, nil)
	require.Equal(t, http.StatusOK, r.Code)
	assert.Contains(t, string(r.Body), `llmq_api_jobs_submitted_total{result="created"} 1`)
	assert.Contains(t, string(r.Body), `llmq_api_requests_total{code="202",route="submit"} 1`)
	assert.NotContains(t, string(r.Body), keyAcme)
	assert.Equal(t, http.StatusNotFound, h.do("GET", "/nope", keyAcme, nil).Code)
}

func TestReadyzFailsWithoutPostgres(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	pool := closedPoolStore(t)
	srv, err := api.New(api.Config{Store: pool, Publisher: h.pub, Inspector: h.insp})
	require.NoError(t, err)
	ts := newTestServer(t, srv)
	resp, err := ts.Client().Get(ts.URL + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
}

// Every route that reads Postgres answers 503 store_unavailable with
// Retry-After when it cannot, and a submission names the id to retry with.
func TestStoreDownAnswers503(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	srv, err := api.New(api.Config{Store: closedPoolStore(t), Publisher: h.pub, Inspector: h.insp, APIKeys: testKeys})
	require.NoError(t, err)
	down := *h
	down.http = newTestServer(t, srv)
	for _, req := range []struct{ method, path string }{
		{"POST", "/v1/jobs"}, {"GET", "/v1/jobs"}, {"GET", "/v1/jobs/x"}, {"GET", "/v1/jobs/x/request"}, {"POST", "/v1/jobs/x/cancel"},
		{"GET", "/v1/dlq"}, {"POST", "/v1/dlq/1/replay"}, {"POST", "/v1/dlq/replay"},
	} {
		r := down.do(req.method, req.path, keyAcme, jobBody("down-1", nil))
		require.Equal(t, http.StatusServiceUnavailable, r.Code, "%s %s: %s", req.method, req.path, r.Body)
		assert.Equal(t, api.CodeStoreUnavailable, r.apiError(t).Error.Code, "%s %s", req.method, req.path)
		assert.Equal(t, "5", r.Header.Get("Retry-After"), "%s %s", req.method, req.path)
		if req.path == "/v1/jobs" && req.method == "POST" {
			var body struct{ ID string }
			r.json(t, &body)
			assert.Equal(t, "down-1", body.ID)
		}
	}
	// A batch answers per item.
	r := down.do("POST", "/v1/jobs:batch", keyAcme, []byte("["+string(jobBody("down-2", nil))+"]"))
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	var resp api.BatchResponse
	r.json(t, &resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.Results[0].HTTPStatus)
}

func TestDLQListRefusesBadQueries(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for q, field := range map[string]string{"limit=0": "limit", "limit=501": "limit", "cursor=nope": "cursor"} {
		r := h.do("GET", "/v1/dlq?"+q, keyAcme, nil)
		require.Equal(t, http.StatusBadRequest, r.Code, q)
		e := r.apiError(t)
		assert.Equal(t, api.CodeInvalidRequest, e.Error.Code, q)
		assert.Equal(t, field, e.Error.Field, q)
	}
}

// recordingPublisher signals each status it publishes.
type recordingPublisher struct {
	broker.Publisher
	statuses chan []byte
}

func (p *recordingPublisher) PublishStatus(ctx context.Context, body []byte) error {
	select {
	case p.statuses <- body:
	default:
	}
	return p.Publisher.PublishStatus(ctx, body)
}

func TestRunPublishesStatusAndStops(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	pub := &recordingPublisher{Publisher: h.pub, statuses: make(chan []byte, 16)}
	srv, err := api.New(api.Config{Store: h.store, Publisher: pub, Inspector: h.insp,
		Backpressure: config.Backpressure{SoftLimit: 10, HardLimit: 20, StatusInterval: 50 * time.Millisecond}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Run(ctx) }()
	for range 2 { // the first at start, the next on the interval
		select {
		case body := <-pub.statuses:
			var st api.Status
			require.NoError(t, json.Unmarshal(body, &st))
			assert.Equal(t, api.StateOK, st.State)
			assert.EqualValues(t, 20, st.HardLimit)
		case <-time.After(30 * time.Second):
			t.Fatal("no status published")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// A job Postgres refuses must not sink the jobs group-committed with it.
func TestUnstorableJobDoesNotSinkItsBatch(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	nul := `{"id":"nul","model":"m","request":{"messages":[{"role":"user","content":"a\u0000b"}]}}`
	surrogate := `{"id":"sur","model":"m","request":{"messages":[{"role":"user","content":"x"}]},"metadata":{"k":"\ud800"}}`
	escapedBackslash := `{"id":"esc","model":"m","request":{"messages":[{"role":"user","content":"a\\u0000b"}]}}`
	batch := "[" + strings.Join([]string{string(jobBody("ok-1", nil)), nul, surrogate, escapedBackslash, string(jobBody("ok-2", nil))}, ",") + "]"
	r := h.do("POST", "/v1/jobs:batch", keyAcme, []byte(batch))
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	var resp api.BatchResponse
	r.json(t, &resp)
	require.Len(t, resp.Results, 5)
	assert.Equal(t, http.StatusAccepted, resp.Results[0].HTTPStatus)
	assert.Equal(t, http.StatusBadRequest, resp.Results[1].HTTPStatus)
	assert.Equal(t, "request", resp.Results[1].Error.Field)
	assert.Equal(t, http.StatusBadRequest, resp.Results[2].HTTPStatus, "%+v", resp.Results[2].Error)
	assert.Equal(t, api.CodeInvalidJob, resp.Results[2].Error.Code)
	assert.Equal(t, http.StatusAccepted, resp.Results[3].HTTPStatus, "an escaped backslash before u0000 is not NUL")
	assert.Equal(t, http.StatusAccepted, resp.Results[4].HTTPStatus)
	assert.EqualValues(t, 3, h.depth(job.PriorityNormal), "only stored jobs stay published")

	r = h.do("POST", "/v1/jobs", keyAcme, []byte(surrogate))
	require.Equal(t, http.StatusBadRequest, r.Code, "%s", r.Body)
}

func withModels(names ...string) harnessOpt {
	return func(c *api.Config) {
		c.Models = map[string]config.Model{}
		for _, n := range names {
			c.Models[n] = config.Model{}
		}
	}
}

func TestUnknownModelIsRefusedNamingTheField(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withModels("qwen-plus", "qwen-flash"))
	r := h.do("POST", "/v1/jobs", keyAcme, jobBody("u1", map[string]any{"model": "gpt-9"}))
	require.Equal(t, http.StatusBadRequest, r.Code, "%s", r.Body)
	assert.Equal(t, "model", r.apiError(t).Error.Field)
	assert.Contains(t, r.apiError(t).Error.Message, `"gpt-9" is not a configured model`)
	r = h.do("POST", "/v1/jobs", keyAcme, jobBody("u2", map[string]any{"model": "qwen-plus", "fallback_models": []string{"qwen-flash", "nope"}}))
	require.Equal(t, http.StatusBadRequest, r.Code, "%s", r.Body)
	assert.Equal(t, "fallback_models[1]", r.apiError(t).Error.Field)
	_, err := h.store.Get(context.Background(), job.Key{Tenant: "acme", ID: "u1"})
	require.ErrorIs(t, err, store.ErrNotFound, "nothing stored")
	require.Equal(t, http.StatusAccepted, h.do("POST", "/v1/jobs", keyAcme, jobBody("ok", map[string]any{"model": "qwen-plus"})).Code)
}

// TestReplayOfAJobRefusedAtIntake: a queue message for a model not yet
// configured is a failed job whose dead letter holds the body; its replay
// is refused while the body is still invalid, and runs the body's job once
// the model is configured.
func TestReplayOfAJobRefusedAtIntake(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withModels("qwen-plus"))
	ctx := context.Background()
	body := jobBody("late-model", map[string]any{"model": "qwen-max", "priority": "high"})
	got, err := h.store.RecordIntakeFailure(ctx, store.IntakeFailure{Tenant: "acme", ID: "late-model", Model: "qwen-max",
		Lane: job.PriorityHigh, Reason: `invalid job: model: "qwen-max" is not a configured model`, Body: body})
	require.NoError(t, err)
	require.Equal(t, store.IntakeJobFailed, got)
	var dlq api.DLQResponse
	h.do("GET", "/v1/dlq", keyAcme, nil).json(t, &dlq)
	require.Len(t, dlq.DeadLetters, 1)
	id := dlq.DeadLetters[0].ID

	r := h.do("POST", fmt.Sprintf("/v1/dlq/%d/replay", id), keyAcme, nil)
	require.Equal(t, http.StatusConflict, r.Code, "%s", r.Body)
	assert.Contains(t, r.apiError(t).Error.Message, "not a configured model")

	later := newHarnessWithStore(t, h)
	srv, err := api.New(api.Config{Store: h.store, Publisher: later.pub, Inspector: h.insp, APIKeys: testKeys,
		Models: map[string]config.Model{"qwen-plus": {}, "qwen-max": {}}})
	require.NoError(t, err)
	later.http = newTestServer(t, srv)
	r = later.do("POST", fmt.Sprintf("/v1/dlq/%d/replay", id), keyAcme, nil)
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	rec, err := h.store.Get(ctx, job.Key{Tenant: "acme", ID: "late-model"})
	require.NoError(t, err)
	assert.Equal(t, job.StatusQueued, rec.Status)
	assert.Equal(t, "qwen-max", rec.Model)
	assert.Equal(t, job.PriorityHigh, rec.Priority)
	assert.NotEqual(t, "{}", string(rec.Request), "the placeholder is replaced by the body's request")
	assert.EqualValues(t, 1, h.depth(job.PriorityHigh))
}
