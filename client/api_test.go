package client_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/testsvc"
)

func newClient(t *testing.T, url string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(url, append([]client.Option{client.WithAPIKey(apiKey)}, opts...)...)
	require.NoError(t, err)
	return c
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func chatRequest(content string) json.RawMessage {
	return json.RawMessage(`{"messages": [{"role": "user", "content": "` + content + `"}], "max_tokens": 32}`)
}

// A batch over HTTP: each job is taken or refused on its own, a job with no
// ID gets one, every taken job succeeds and Wait returns it, and the same
// batch again creates nothing.
func TestSubmitBatchAndWait(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t, apiURL)
	id := randomName("batch-")
	jobs := []client.Job{
		{ID: id + "-1", Model: "qwen-plus", Request: chatRequest("one"), Priority: client.PriorityHigh},
		{Model: "qwen-plus", Request: chatRequest("two"), Metadata: json.RawMessage(`{"ticket": 2}`)},
		{ID: id + "-3", Model: "gpt-nope", Request: chatRequest("three")},
	}
	results, err := c.SubmitBatch(ctx, jobs)
	require.NoError(t, err)
	require.Len(t, results, 3)
	assert.Equal(t, id+"-1", results[0].ID)
	assert.True(t, strings.HasPrefix(results[1].ID, "j-"), "a generated ID: %q", results[1].ID)
	for _, r := range results[:2] {
		require.NoError(t, r.Err)
		assert.True(t, r.Created)
		assert.Equal(t, client.StatusQueued, r.Status)
	}
	var apiErr *client.APIError
	require.ErrorAs(t, results[2].Err, &apiErr)
	assert.Equal(t, 400, apiErr.StatusCode)
	assert.Equal(t, "model", apiErr.Field)
	assert.Equal(t, id+"-3", apiErr.JobID)
	assert.False(t, client.IsRetryable(results[2].Err))

	for _, r := range results[:2] {
		st, err := c.Wait(ctx, r.ID, client.WaitOptions{})
		require.NoError(t, err)
		assert.Equal(t, client.StatusSucceeded, st.Status)
		assert.Equal(t, "qwen-plus", st.ModelUsed)
		assert.Equal(t, 1, st.Attempts)
		assert.NotEmpty(t, st.Response)
		require.NotNil(t, st.Usage)
		assert.Positive(t, st.Usage.TotalTokens)
		assert.NotNil(t, st.CompletedAt)
		assert.Nil(t, st.Error)
	}

	jobs[1].ID = results[1].ID
	again, err := c.SubmitBatch(ctx, jobs[:2])
	require.NoError(t, err)
	for _, r := range again {
		require.NoError(t, r.Err)
		assert.False(t, r.Created, "job %s existed", r.ID)
		assert.Equal(t, client.StatusSucceeded, r.Status)
	}
}

// A 400 is an *APIError naming the field, and not worth retrying; the
// returned Submitted still carries the job's (generated) ID.
func TestSubmitInvalid(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t, apiURL)
	for _, tc := range []struct {
		name  string
		job   client.Job
		field string
	}{
		{"no messages", client.Job{Model: "qwen-plus", Request: json.RawMessage(`{}`)}, "request.messages"},
		{"unknown model", client.Job{Model: "gpt-nope", Request: chatRequest("x")}, "model"},
		{"another tenant", client.Job{Tenant: "billing", Model: "qwen-plus", Request: chatRequest("x")}, "tenant"},
		{"max_tokens 0", client.Job{Model: "qwen-plus", Request: json.RawMessage(`{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}`)}, "request.max_tokens"},
		{"bad id", client.Job{ID: "no spaces", Model: "qwen-plus", Request: chatRequest("x")}, "id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub, err := c.Submit(ctx, tc.job)
			var apiErr *client.APIError
			require.ErrorAs(t, err, &apiErr)
			assert.Equal(t, 400, apiErr.StatusCode)
			assert.Equal(t, client.CodeInvalidJob, apiErr.Code)
			assert.Equal(t, tc.field, apiErr.Field)
			assert.False(t, client.IsRetryable(err))
			assert.NotEmpty(t, sub.ID)
		})
	}
}

// A job the tenant does not have is a 404; Wait gives up on it at once,
// or after NotFoundGrace.
func TestGetMissing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t, apiURL)
	_, err := c.Get(ctx, "no-such-job")
	var apiErr *client.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 404, apiErr.StatusCode)
	assert.Equal(t, client.CodeNotFound, apiErr.Code)
	assert.False(t, client.IsRetryable(err))

	_, err = c.Wait(ctx, "no-such-job", client.WaitOptions{})
	require.ErrorAs(t, err, &apiErr)
	start := time.Now()
	_, err = c.Wait(ctx, "no-such-job", client.WaitOptions{NotFoundGrace: 300 * time.Millisecond, Interval: 50 * time.Millisecond})
	require.ErrorAs(t, err, &apiErr)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)

	other, err := client.New(apiURL, client.WithAPIKey("not-a-key"))
	require.NoError(t, err)
	_, err = other.Get(ctx, "no-such-job")
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, client.CodeUnauthorized, apiErr.Code)
}

// Back-pressure on a deployment of its own with a hard limit of one job
// and no consumer: the second job is a *BackpressureError with the
// server's Retry-After, WithSubmitRetry does not start a wait longer than
// its budget, a job already held is answered despite the back-pressure,
// and a queued job can be cancelled once.
func TestBackpressure(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	td := cleanup(t)
	pg, err := newDatabase(ctx, td)
	require.NoError(t, err)
	cfg, err := llmqConfig(pg, "kafka", "", testsvc.KafkaBrokers(t), "backpressure: {soft_limit: 1, hard_limit: 1}\n")
	require.NoError(t, err)
	api, err := startLLMQ(ctx, td, cfg, false)
	require.NoError(t, err)
	c := newClient(t, api)

	first, err := c.Submit(ctx, client.Job{ID: "bp-1", Model: "qwen-plus", Request: chatRequest("one")})
	require.NoError(t, err)
	require.True(t, first.Created)

	_, err = c.Submit(ctx, client.Job{ID: "bp-2", Model: "qwen-plus", Request: chatRequest("two")})
	var bp *client.BackpressureError
	require.ErrorAs(t, err, &bp)
	assert.Positive(t, bp.RetryAfter)
	assert.GreaterOrEqual(t, bp.Backlog, int64(1))
	assert.True(t, client.IsRetryable(err))

	patient := newClient(t, api, client.WithSubmitRetry(2*time.Second))
	start := time.Now()
	_, err = patient.Submit(ctx, client.Job{ID: "bp-2", Model: "qwen-plus", Request: chatRequest("two")})
	require.ErrorAs(t, err, &bp)
	assert.Less(t, time.Since(start), 2*time.Second, "a Retry-After of %s is over the budget: no wait", bp.RetryAfter)

	again, err := c.Submit(ctx, client.Job{ID: "bp-1", Model: "qwen-plus", Request: chatRequest("one")})
	require.NoError(t, err)
	assert.False(t, again.Created)

	results, err := c.SubmitBatch(ctx, []client.Job{
		{ID: "bp-3", Model: "qwen-plus", Request: chatRequest("three")},
		{Model: "qwen-plus", Request: chatRequest("four")},
	})
	require.ErrorAs(t, err, &bp)
	for _, r := range results {
		assert.NotEmpty(t, r.ID)
		assert.ErrorIs(t, r.Err, err)
	}

	status, err := c.Backpressure(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 1, status.HardLimit)

	st, err := c.Cancel(ctx, "bp-1")
	require.NoError(t, err)
	assert.Equal(t, client.StatusCancelled, st.Status)
	_, err = c.Cancel(ctx, "bp-1")
	var apiErr *client.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, client.CodeConflict, apiErr.Code)
	assert.False(t, client.IsRetryable(err))
}

// A published job for a model llmq does not know is refused at intake: it
// is failed (Wait returns it, without error), its message is a dead letter,
// and replaying it answers 409 while it is still invalid.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	pub, err := client.NewAMQPPublisher(amqpURL)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(ctx, client.Job{ID: "dlq-1", Tenant: "support", Model: "gpt-nope", Request: chatRequest("x")}))

	c := newClient(t, apiURL)
	st, err := c.Wait(ctx, "dlq-1", client.WaitOptions{NotFoundGrace: 30 * time.Second})
	require.NoError(t, err)
	assert.Equal(t, client.StatusFailed, st.Status)
	require.NotNil(t, st.Error)
	assert.Equal(t, "invalid", st.Error.Kind)
	assert.Contains(t, st.Error.Message, "gpt-nope")

	var found *client.DeadLetter
	for cursor := ""; found == nil; {
		page, err := c.DeadLetters(ctx, cursor)
		require.NoError(t, err)
		for i, dl := range page.DeadLetters {
			if dl.JobID == "dlq-1" {
				found = &page.DeadLetters[i]
			}
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	require.NotNil(t, found, "dlq-1 is a dead letter")
	assert.Equal(t, client.PriorityNormal, found.Lane)
	assert.JSONEq(t, `{"id":"dlq-1","tenant":"support","model":"gpt-nope","request":`+string(chatRequest("x"))+`}`, string(found.Body))

	_, err = c.Replay(ctx, found.ID)
	var apiErr *client.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 409, apiErr.StatusCode)
	assert.False(t, client.IsRetryable(err))
}

// GetMany fetches several jobs in one request, and Finished follows the
// jobs as they finish, each once, with metadata.
func TestGetManyAndFinished(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t, apiURL)
	start, err := c.Finished(ctx, "", 0)
	require.NoError(t, err)
	cursor := start.NextCursor
	for len(start.Jobs) > 0 { // other tests' jobs: skip to the end
		start, err = c.Finished(ctx, cursor, 0)
		require.NoError(t, err)
		cursor = start.NextCursor
	}
	id := randomName("many-")
	_, err = c.Submit(ctx, client.Job{ID: id, Model: "qwen-plus", Request: chatRequest("many"), Metadata: json.RawMessage(`{"k": 1}`)})
	require.NoError(t, err)
	got, err := c.GetMany(ctx, []string{"nope-" + id, id})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, id, got[0].ID)
	assert.JSONEq(t, `{"k": 1}`, string(got[0].Metadata))

	st, err := c.Wait(ctx, id, client.WaitOptions{})
	require.NoError(t, err)
	require.True(t, st.Status.Terminal())
	var seen []string
	for range 100 { // the feed holds a job back only while an older transaction runs
		page, err := c.Finished(ctx, cursor, 0)
		require.NoError(t, err)
		cursor = page.NextCursor
		for _, j := range page.Jobs {
			seen = append(seen, j.ID)
			if j.ID == id {
				assert.JSONEq(t, `{"k": 1}`, string(j.Metadata))
			}
		}
		if slices.Contains(seen, id) {
			break
		}
	}
	assert.Equal(t, 1, countOf(seen, id), "listed once: %v", seen)
}

func countOf(s []string, v string) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}
