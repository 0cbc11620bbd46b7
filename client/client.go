package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client calls llmq's HTTP API (`producer serve`). It holds no goroutines
// and is safe for concurrent use.
type Client struct {
	base   string // scheme://host[:port][/prefix], no trailing slash
	apiKey string
	// tenant is WithTenant's: sent as ?tenant= on every request.
	tenant string
	hc     *http.Client
	// retryFor is WithSubmitRetry's budget; 0: no retries.
	retryFor time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithAPIKey sends key as "Authorization: Bearer <key>". The key decides
// the tenant of every job the client submits and sees.
func WithAPIKey(key string) Option { return func(c *Client) { c.apiKey = key } }

// WithTenant makes an admin key (admin_keys) act for tenant: every request
// names it (?tenant=), so the client reads, cancels and replays that
// tenant's jobs, and submits a job that names no tenant as that tenant's.
// With a tenant key only the key's own tenant may be named: any other
// answers 404 for one job or dead letter, 403 (CodeForbidden) otherwise.
func WithTenant(tenant string) Option { return func(c *Client) { c.tenant = tenant } }

// WithHTTPClient replaces the default HTTP client (one with a one-minute
// timeout per request).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithSubmitRetry makes Submit and SubmitBatch retry what IsRetryable calls
// retryable — back-pressure (429) and 503s after their Retry-After, a lost
// connection after a short backoff with jitter — with the same job IDs,
// for as long as the waits add up to at most maxWait and ctx allows. A
// wait that would overrun maxWait is not started: the last error is
// returned at once. Off by default: without it a 429 comes back as a
// *BackpressureError at once, so that the caller, which may be holding a
// request of its own, decides whether to wait.
func WithSubmitRetry(maxWait time.Duration) Option {
	return func(c *Client) { c.retryFor = maxWait }
}

// New returns a client of the API at baseURL, e.g. "http://127.0.0.1:8080".
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("llmq: base URL %q: want http(s)://host[:port]", baseURL)
	}
	c := &Client{base: strings.TrimRight(baseURL, "/"), hc: &http.Client{Timeout: time.Minute}}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Get returns the job's status. A job of another tenant answers 404 like
// a missing one: an *APIError with Code CodeNotFound.
func (c *Client) Get(ctx context.Context, id string) (JobStatus, error) {
	var st JobStatus
	if err := c.call(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id), nil, &st); err != nil {
		return st, fmt.Errorf("llmq: get job %s: %w", id, err)
	}
	return st.normalized(), nil
}

// Cancel cancels a job that has not finished and returns its status. A
// finished job cannot be cancelled: a 409 (Code CodeConflict).
func (c *Client) Cancel(ctx context.Context, id string) (JobStatus, error) {
	var st JobStatus
	if err := c.call(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/cancel", nil, &st); err != nil {
		return st, fmt.Errorf("llmq: cancel job %s: %w", id, err)
	}
	return st.normalized(), nil
}

// DeadLetters returns a page of the tenant's dead letters, oldest first:
// cursor "" for the first page, then the page's NextCursor until it is "".
func (c *Client) DeadLetters(ctx context.Context, cursor string) (DeadLetterPage, error) {
	path := "/v1/dlq"
	if cursor != "" {
		path += "?cursor=" + url.QueryEscape(cursor)
	}
	var page DeadLetterPage
	if err := c.call(ctx, http.MethodGet, path, nil, &page); err != nil {
		return page, fmt.Errorf("llmq: list dead letters: %w", err)
	}
	return page, nil
}

// Replay queues a dead letter's job again (a job refused at intake is
// re-read from its original message; while that is still invalid the API
// answers 409 saying why), or re-publishes a message's dead letter.
func (c *Client) Replay(ctx context.Context, deadLetterID int64) (Replayed, error) {
	var r Replayed
	path := "/v1/dlq/" + strconv.FormatInt(deadLetterID, 10) + "/replay"
	if err := c.call(ctx, http.MethodPost, path, nil, &r); err != nil {
		return r, fmt.Errorf("llmq: replay dead letter %d: %w", deadLetterID, err)
	}
	return r, nil
}

// Backpressure returns the back-pressure status (GET /v1/status).
func (c *Client) Backpressure(ctx context.Context) (BackpressureStatus, error) {
	var st BackpressureStatus
	if err := c.call(ctx, http.MethodGet, "/v1/status", nil, &st); err != nil {
		return st, fmt.Errorf("llmq: get status: %w", err)
	}
	return st, nil
}

// normalized reads a JSON null response as no response.
func (s JobStatus) normalized() JobStatus {
	if isNull(s.Response) {
		s.Response = nil
	}
	return s
}

// response is an answer of the API, read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

// call sends one request and decodes a 2xx answer into out; any other is
// returned as an error (see response.err).
func (c *Client) call(ctx context.Context, method, path string, body []byte, out any) error {
	r, err := c.send(ctx, method, path, body)
	if err == nil {
		err = r.err()
	}
	if err != nil {
		return err
	}
	return r.decode(out)
}

// send makes one request. It fails only when no answer came: with the
// caller's context error once ctx has ended, else with a retryable
// *transportError.
func (c *Client) send(ctx context.Context, method, path string, body []byte) (response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	if c.tenant != "" {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		path += sep + "tenant=" + url.QueryEscape(c.tenant)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.hc.Do(req)
	if err == nil {
		defer resp.Body.Close()
		var data []byte
		if data, err = io.ReadAll(resp.Body); err == nil {
			return response{status: resp.StatusCode, header: resp.Header, body: data}, nil
		}
	}
	if ctx.Err() != nil {
		return response{}, context.Cause(ctx)
	}
	return response{}, &transportError{err: err}
}

func (r response) decode(out any) error {
	if err := json.Unmarshal(r.body, out); err != nil {
		return fmt.Errorf("decode the API's %d answer: %w", r.status, err)
	}
	return nil
}

// errorBody is the body of every error response.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Field   string `json:"field"`
		Message string `json:"message"`
	} `json:"error"`
	ID      string `json:"id"`
	Backlog int64  `json:"backlog"`
}

// err is nil for a 2xx, a *BackpressureError for a 429, else an *APIError.
func (r response) err() error {
	if r.status >= 200 && r.status < 300 {
		return nil
	}
	var b errorBody
	if json.Unmarshal(r.body, &b) != nil || b.Error.Code == "" {
		// Not the API's own answer: a proxy's, or a crash.
		b.Error.Code, b.Error.Message = "http_"+strconv.Itoa(r.status), strings.TrimSpace(string(r.body))
		if len(b.Error.Message) > 200 {
			b.Error.Message = b.Error.Message[:200] + "…"
		}
	}
	retryAfter := parseRetryAfter(r.header.Get("Retry-After"), time.Now())
	if r.status == http.StatusTooManyRequests {
		return &BackpressureError{RetryAfter: retryAfter, Backlog: b.Backlog}
	}
	return &APIError{
		StatusCode: r.status, Code: b.Error.Code, Field: b.Error.Field, Message: b.Error.Message,
		JobID: b.ID, RetryAfter: retryAfter,
	}
}

// parseRetryAfter reads Retry-After in seconds or as an HTTP date; 0 when
// absent or unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
