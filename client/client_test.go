package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/client"
)

// The tests below answer the client from a script instead of the API, to
// reach what the API cannot be made to do on cue (a 503, a lost
// connection), and run in virtual time (testing/synctest), so waits cost
// nothing and are measured exactly.

// answer is one scripted reply: a status, headers and body, or a transport
// error.
type answer struct {
	status  int
	headers map[string]string
	body    string
	err     error
}

// script is an http.RoundTripper that gives its answers in order (the last
// one again once they run out) and records each request.
type script struct {
	mu       sync.Mutex
	answers  []answer
	requests []recorded
}

type recorded struct {
	at   time.Time
	path string
	body string
	auth string
}

func (s *script) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
	}
	s.requests = append(s.requests, recorded{at: time.Now(), path: req.URL.RequestURI(), body: string(body), auth: req.Header.Get("Authorization")})
	a := s.answers[0]
	if len(s.answers) > 1 {
		s.answers = s.answers[1:]
	}
	if a.err != nil {
		return nil, a.err
	}
	h := http.Header{"Content-Type": {"application/json"}}
	for k, v := range a.headers {
		h.Set(k, v)
	}
	return &http.Response{StatusCode: a.status, Header: h, Body: io.NopCloser(strings.NewReader(a.body)), Request: req}, nil
}

func scripted(t *testing.T, answers []answer, opts ...client.Option) (*client.Client, *script) {
	t.Helper()
	s := &script{answers: answers}
	opts = append([]client.Option{client.WithAPIKey("k"), client.WithHTTPClient(&http.Client{Transport: s})}, opts...)
	c, err := client.New("http://llmq.test:8080/", opts...)
	require.NoError(t, err)
	return c, s
}

var (
	full      = answer{status: 429, headers: map[string]string{"Retry-After": "2"}, body: `{"error":{"code":"backpressure","message":"full"},"backlog":7}`}
	down      = answer{status: 503, headers: map[string]string{"Retry-After": "1"}, body: `{"error":{"code":"broker_unavailable","message":"retry later with the same id"},"id":"j-1"}`}
	lost      = answer{err: errors.New("connection reset by peer")}
	accepted  = answer{status: 202, body: `{"id":"j-1","status":"queued"}`}
	submitJob = client.Job{Model: "qwen-plus", Request: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}]}`)}
)

// WithSubmitRetry waits each Retry-After (and a short backoff after a lost
// connection) and sends the same job ID every time.
func TestSubmitRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, s := scripted(t, []answer{lost, full, down, accepted}, client.WithSubmitRetry(time.Minute))
		start := time.Now()
		sub, err := c.Submit(t.Context(), submitJob)
		require.NoError(t, err)
		assert.Equal(t, client.Submitted{ID: "j-1", Status: client.StatusQueued, Created: true}, sub)
		require.Len(t, s.requests, 4)
		waited := time.Since(start)
		assert.GreaterOrEqual(t, waited, 3*time.Second+50*time.Millisecond, "a first backoff of 50..100ms, then 2s and 1s")
		assert.LessOrEqual(t, waited, 3*time.Second+100*time.Millisecond)
		var first struct{ ID string }
		require.NoError(t, json.Unmarshal([]byte(s.requests[0].body), &first))
		assert.True(t, strings.HasPrefix(first.ID, "j-"))
		for _, r := range s.requests {
			assert.Equal(t, "/v1/jobs", r.path)
			assert.Equal(t, "Bearer k", r.auth)
			assert.Contains(t, r.body, `"id":"`+first.ID+`"`)
		}
	})
}

// Without WithSubmitRetry, or when the Retry-After is over its budget, a
// 429 comes back at once, as does a 4xx with any budget; a context that
// ends during a wait ends it.
func TestSubmitNoRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, opts := range [][]client.Option{nil, {client.WithSubmitRetry(time.Second)}} {
			c, s := scripted(t, []answer{full, accepted}, opts...)
			start := time.Now()
			sub, err := c.Submit(t.Context(), submitJob)
			var bp *client.BackpressureError
			require.ErrorAs(t, err, &bp)
			assert.Equal(t, client.BackpressureError{RetryAfter: 2 * time.Second, Backlog: 7}, *bp)
			assert.True(t, client.IsRetryable(err))
			assert.NotEmpty(t, sub.ID)
			assert.Len(t, s.requests, 1)
			assert.Zero(t, time.Since(start))
		}

		bad := answer{status: 400, body: `{"error":{"code":"invalid_job","field":"model","message":"invalid job: model: is required"}}`}
		c, s := scripted(t, []answer{bad}, client.WithSubmitRetry(time.Minute))
		_, err := c.Submit(t.Context(), submitJob)
		assert.Equal(t, &client.APIError{StatusCode: 400, Code: "invalid_job", Field: "model", Message: "invalid job: model: is required"}, errors.Unwrap(err))
		assert.Len(t, s.requests, 1)

		c, _ = scripted(t, []answer{full}, client.WithSubmitRetry(time.Minute))
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, err = c.Submit(ctx, submitJob)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.False(t, client.IsRetryable(err))
	})
}

// Error answers become typed errors that say whether to retry.
func TestErrorAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			answer    answer
			want      error
			retryable bool
		}{
			{down, &client.APIError{StatusCode: 503, Code: "broker_unavailable", Message: "retry later with the same id", JobID: "j-1", RetryAfter: time.Second}, true},
			{answer{status: 502, body: "<html>Bad Gateway</html>"}, &client.APIError{StatusCode: 502, Code: "http_502", Message: "<html>Bad Gateway</html>"}, true},
			{answer{status: 409, body: `{"error":{"code":"conflict","message":"the job is succeeded"}}`}, &client.APIError{StatusCode: 409, Code: "conflict", Message: "the job is succeeded"}, false},
			{answer{status: 429, headers: map[string]string{"Retry-After": time.Now().Add(4 * time.Second).UTC().Format(http.TimeFormat)}, body: `{}`}, &client.BackpressureError{RetryAfter: 4 * time.Second}, true},
		} {
			c, _ := scripted(t, []answer{tc.answer})
			_, err := c.Cancel(t.Context(), "j-1")
			assert.Equal(t, tc.want, errors.Unwrap(err))
			assert.Equal(t, tc.retryable, client.IsRetryable(err), "%v", err)
		}
		c, _ := scripted(t, []answer{lost})
		_, err := c.Get(t.Context(), "j-1")
		require.ErrorContains(t, err, "connection reset")
		assert.True(t, client.IsRetryable(err))
	})
}

func TestIsRetryable(t *testing.T) {
	publish := func(err error) error { return &client.PublishError{JobID: "j", To: "topic llmq.jobs.normal", Err: err} }
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("plain"), false},
		{&client.APIError{StatusCode: 400}, false},
		{&client.APIError{StatusCode: 404}, false},
		{&client.APIError{StatusCode: 429}, true},
		{&client.APIError{StatusCode: 500}, true},
		{fmt.Errorf("wrapped: %w", &client.APIError{StatusCode: 503}), true},
		{&client.BackpressureError{}, true},
		{&client.ValidationError{Field: "id"}, false},
		{publish(client.ErrRejected), true},
		{publish(errors.New("no confirm: connection lost")), true},
		{publish(client.ErrUnroutable), false},
		{publish(client.ErrClosed), false},
		{publish(context.Canceled), false},
	} {
		assert.Equal(t, tc.want, client.IsRetryable(tc.err), "%v", tc.err)
	}
}

// Wait polls with a growing, jittered delay, polls through a passing
// outage, and returns the terminal status; a context that ends first
// returns the last status seen.
func TestWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		queued := answer{status: 200, body: `{"id":"j-1","status":"queued","response":null}`}
		done := answer{status: 200, body: `{"id":"j-1","status":"failed","attempts":1,"error":{"attempt":1,"kind":"client","message":"400 from provider"}}`}
		c, s := scripted(t, []answer{queued, queued, down, queued, queued, queued, done})
		st, err := c.Wait(t.Context(), "j-1", client.WaitOptions{Interval: 100 * time.Millisecond, MaxInterval: 300 * time.Millisecond})
		require.NoError(t, err)
		assert.Equal(t, client.StatusFailed, st.Status)
		assert.Equal(t, "client", st.Error.Kind)
		require.Len(t, s.requests, 7)
		// Delays 100, 150, 225, then capped at 300ms, each drawn from [d/2, d].
		want := []time.Duration{100, 150, 225, 300, 300, 300}
		for i, d := range want {
			gap := s.requests[i+1].at.Sub(s.requests[i].at)
			assert.GreaterOrEqual(t, gap, d*time.Millisecond/2, "gap %d", i)
			assert.LessOrEqual(t, gap, d*time.Millisecond, "gap %d", i)
		}

		c, _ = scripted(t, []answer{queued})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		st, err = c.Wait(ctx, "j-1", client.WaitOptions{})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "last seen queued")
		assert.Equal(t, client.StatusQueued, st.Status)
		assert.Nil(t, st.Response, "a null response reads as none")
	})
}

func TestNew(t *testing.T) {
	for _, bad := range []string{"", "llmq:8080", "ftp://llmq", "http://"} {
		_, err := client.New(bad)
		assert.Error(t, err, bad)
	}
	assert.True(t, strings.HasPrefix(client.NewID(), "j-"))
	assert.Len(t, client.NewID(), 28)
	assert.NotEqual(t, client.NewID(), client.NewID())
}
