// Package provider is llmq's client for OpenAI-compatible chat APIs
// (OpenAI, DashScope compatible mode, llmsim). It owns the wire: the job's
// request body passed through byte for byte with only the top-level "model"
// (and, for streaming, "stream"/"stream_options") set by llmq, usage and
// rate-limit headers read back, SSE streams assembled into one
// chat.completion body, errors classified with ratecontrol.Classify, the
// X-DashScope-Wait-Timeout header with the matching client timeout, a
// keep-alive pool sized to the concurrency and a cap on response bodies.
//
// The API key is sent only in the Authorization header. It never appears in
// an error, a log line or a returned body: provider error messages are
// scrubbed of it (and of the configured extra headers' values) in case a
// provider echoes it. Router sends each llmq model to the client of its
// provider under the model's upstream name (docs/design.md#providers).
package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ratecontrol"
)

// minScrubbed is the shortest header value scrubbed from errors.
const minScrubbed = 8

// Defaults of Config.
const (
	DefaultTimeout      = 120 * time.Second
	DefaultMaxConns     = 64
	DefaultMaxBodyBytes = 8 << 20
)

// Config configures a Client.
type Config struct {
	// BaseURL ends in …/v1; the client posts to BaseURL + "/chat/completions".
	BaseURL string
	// NativeBaseURL is DashScope's native API (…/api/v1), where task jobs
	// go (tasks.go); default: BaseURL with its …/v1 or
	// …/compatible-mode/v1 replaced by /api/v1.
	NativeBaseURL string
	// APIKey is sent as "Authorization: Bearer <key>" and nowhere else.
	APIKey config.Secret
	// Headers are sent with every call. Their values are scrubbed from
	// errors like the key: a gateway may take its credential in one.
	Headers map[string]config.Secret
	// Timeout is the base per-call timeout (default 120s).
	Timeout time.Duration
	// WaitTimeout, when positive, is sent as X-DashScope-Wait-Timeout (whole
	// seconds, rounded up). Non-streaming calls then time out after
	// Timeout+WaitTimeout; streaming calls must see their first chunk within
	// WaitTimeout+FirstChunkTimeout and then finish within Timeout.
	WaitTimeout time.Duration
	// FirstChunkTimeout bounds the wait for a stream's first chunk beyond
	// WaitTimeout (default Timeout).
	FirstChunkTimeout time.Duration
	// Stream makes every call with stream=true and include_usage.
	Stream bool
	// MaxConns sizes the keep-alive pool (MaxIdleConnsPerHost and
	// MaxConnsPerHost); set it to the total concurrency (default 64).
	MaxConns int
	// MaxBodyBytes caps a response body (default 8 MiB).
	MaxBodyBytes int64
	// Transport replaces the tuned transport (tests: a RoundTripper over an
	// http.Handler).
	Transport http.RoundTripper
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.FirstChunkTimeout <= 0 {
		c.FirstChunkTimeout = c.Timeout
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return c
}

// Client calls one OpenAI-compatible endpoint. Safe for concurrent use.
type Client struct {
	cfg           Config
	url           string // of chat completions
	embeddingsURL string
	audioURL      string
	nativeURL     string
	// fixed is every request's header (Headers, the content types, the
	// key, the wait timeout), shared by the requests that add nothing to it.
	fixed   http.Header
	secrets []string // the key and header values, scrubbed from errors
	rt      http.RoundTripper
	own     *http.Transport
}

// New builds a client with a tuned keep-alive transport.
func New(cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if !strings.HasPrefix(cfg.BaseURL, "http://") && !strings.HasPrefix(cfg.BaseURL, "https://") {
		return nil, errors.New("provider: base URL must be an http(s) URL")
	}
	base, basic, err := withoutUserinfo(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, url: base + "/chat/completions", embeddingsURL: base + "/embeddings", audioURL: base + "/audio/transcriptions"}
	c.nativeURL = nativeBase(base, cfg.NativeBaseURL)
	var auth string
	if key := cfg.APIKey.Reveal(); key != "" {
		auth = "Bearer " + key
		c.secrets = append(c.secrets, key)
	} else if basic != nil {
		// As http.Client did for a base URL with user:password@ and no key.
		auth = "Basic " + basic.token
		c.secrets = append(c.secrets, basic.token)
	}
	if basic != nil && basic.password != "" {
		c.secrets = append(c.secrets, basic.password)
	}
	// Headers first: the built-in headers set after them win.
	c.fixed = make(http.Header, len(cfg.Headers)+4)
	for name, v := range cfg.Headers {
		c.fixed.Set(name, v.Reveal())
		// A value too short to be a credential (a version, a flag) would
		// only mangle messages.
		if len(v) >= minScrubbed {
			c.secrets = append(c.secrets, v.Reveal())
		}
	}
	c.fixed.Set("Content-Type", "application/json")
	c.fixed.Set("Accept", "application/json, text/event-stream")
	if auth != "" {
		c.fixed.Set("Authorization", auth)
	}
	if cfg.WaitTimeout > 0 {
		secs := int64((cfg.WaitTimeout + time.Second - 1) / time.Second)
		c.fixed.Set("X-DashScope-Wait-Timeout", strconv.FormatInt(secs, 10))
	}
	rt := cfg.Transport
	if rt == nil {
		c.own = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          cfg.MaxConns,
			MaxIdleConnsPerHost:   cfg.MaxConns,
			MaxConnsPerHost:       cfg.MaxConns,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
		rt = c.own
	}
	// No http.Client: each call sets its own timeout (see send), and a
	// provider's redirect is an error, not a request sent again.
	c.rt = rt
	return c, nil
}

// Close releases idle connections.
func (c *Client) Close() {
	if c.own != nil {
		c.own.CloseIdleConnections()
	}
}

// Response is a successful chat completion.
type Response struct {
	// Model is the model llmq asked for.
	Model string
	// Body is the chat.completion JSON: the provider's body as returned for
	// non-streaming calls, assembled from the chunks for streaming ones.
	Body json.RawMessage
	// Content is the first choice's message content.
	Content          string
	PromptTokens     int
	CompletionTokens int
	// AudioSeconds is the audio duration the provider billed, for an audio
	// call (its usage.seconds, else its duration); 0 for other calls.
	AudioSeconds float64
	// Headers are the response headers (rate-limit headers for the governor).
	Headers http.Header
	Latency time.Duration
}

// Error is a failed call, classified. Its message never contains the key.
type Error struct {
	Class   ratecontrol.Classification
	Headers http.Header
	Latency time.Duration
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("provider")
	if e.Class.Status != 0 {
		fmt.Fprintf(&b, ": HTTP %d", e.Class.Status)
	}
	fmt.Fprintf(&b, ": %s", e.Class.Kind)
	if e.Class.Code != "" {
		fmt.Fprintf(&b, " (%s)", e.Class.Code)
	}
	if e.Class.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Class.Message)
	}
	return b.String()
}

// Chat sends request (an OpenAI chat body) for model and returns the
// completion, or an *Error carrying the classification.
func (c *Client) Chat(ctx context.Context, model string, request []byte) (*Response, error) {
	modelJSON, _ := json.Marshal(model)
	body, err := SetTopLevel(request, "model", modelJSON)
	if err != nil {
		return nil, c.fail(ratecontrol.Classification{Kind: ratecontrol.KindClient, Message: err.Error()}, nil, 0)
	}
	if c.cfg.Stream {
		if body, err = SetTopLevel(body, "stream", []byte("true")); err == nil {
			body, err = SetTopLevel(body, "stream_options", []byte(`{"include_usage":true}`))
		}
		if err != nil {
			return nil, c.fail(ratecontrol.Classification{Kind: ratecontrol.KindClient, Message: err.Error()}, nil, 0)
		}
	}
	return c.post(ctx, c.url, model, body, c.cfg.Stream, c.readBody)
}

// post sends body to url and reads a 200 answer with read (or, when the
// provider streams, as server-sent events); stream says the call asked
// for a stream, whose timeouts differ (see Config.WaitTimeout).
func (c *Client) post(ctx context.Context, url, model string, body []byte, stream bool, read func(io.Reader, *Response) error) (*Response, error) {
	return c.send(ctx, http.MethodPost, url, model, body, nil, stream, read)
}

// send is post for any method, with extra headers.
func (c *Client) send(ctx context.Context, method, url, model string, body []byte, extra http.Header, stream bool, read func(io.Reader, *Response) error) (*Response, error) {
	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var timedOut atomic.Bool
	first := c.cfg.Timeout + c.cfg.WaitTimeout
	if stream {
		first = c.cfg.WaitTimeout + c.cfg.FirstChunkTimeout
	}
	timer := time.AfterFunc(first, func() { timedOut.Store(true); cancel() })
	defer timer.Stop()

	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(callCtx, method, url, rd)
	if err != nil {
		return nil, c.fail(ratecontrol.Classification{Kind: ratecontrol.KindClient, Message: "build request"}, nil, 0)
	}
	req.Header = c.headerFor(ctx, extra)
	start := time.Now()
	resp, err := c.roundTrip(req)
	if err != nil {
		return nil, c.transportErr(ctx, err, &timedOut, nil, time.Since(start))
	}
	defer resp.Body.Close()
	limited := io.LimitReader(resp.Body, c.cfg.MaxBodyBytes+1)
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		io.Copy(io.Discard, limited) //nolint:errcheck // keeps the connection for the next call
		return nil, c.fail(redirected(resp), resp.Header, time.Since(start))
	}

	if resp.StatusCode != http.StatusOK {
		data, rerr := io.ReadAll(limited)
		if rerr != nil && len(data) == 0 {
			return nil, c.transportErr(ctx, rerr, &timedOut, resp.Header, time.Since(start))
		}
		if int64(len(data)) > c.cfg.MaxBodyBytes {
			data = data[:c.cfg.MaxBodyBytes]
		}
		return nil, c.fail(ratecontrol.Classify(resp.StatusCode, resp.Header, c.scrubBytes(data)), resp.Header, time.Since(start))
	}

	out := &Response{Model: model, Headers: resp.Header}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		if stream {
			timer.Reset(c.cfg.Timeout)
		}
		err = c.readStream(limited, out, func() { timer.Reset(c.cfg.Timeout) })
	} else {
		err = read(limited, out)
	}
	out.Latency = time.Since(start)
	if err != nil {
		var pe *Error
		if errors.As(err, &pe) {
			pe.Headers, pe.Latency = resp.Header, out.Latency
			return nil, pe
		}
		return nil, c.transportErr(ctx, err, &timedOut, resp.Header, out.Latency)
	}
	return out, nil
}

var errTooLarge = errors.New("response body over the size limit")

// readCapped reads a 200 body (r is limited to one byte past the cap) and
// fails the call when it is over the cap.
func (c *Client) readCapped(r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > c.cfg.MaxBodyBytes {
		return nil, c.fail(ratecontrol.Classification{Kind: ratecontrol.KindServer, Status: http.StatusOK, Message: errTooLarge.Error()}, nil, 0)
	}
	return data, nil
}

func (c *Client) readBody(r io.Reader, out *Response) error {
	data, err := c.readCapped(r)
	if err != nil {
		return err
	}
	b, ok := readChatBody(data)
	if !ok || !b.hasChoices {
		return c.fail(ratecontrol.Classification{Kind: ratecontrol.KindServer, Status: http.StatusOK, Message: "malformed chat.completion body"}, nil, 0)
	}
	out.Body = data
	out.Content = b.content
	if b.hasUsage {
		out.PromptTokens, out.CompletionTokens = b.prompt, b.completion
	}
	return nil
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// fail builds an *Error whose message is scrubbed of the API key.
func (c *Client) fail(cl ratecontrol.Classification, h http.Header, lat time.Duration) *Error {
	// Scrub before truncating: a cut through the key would leave a prefix.
	cl.Message = truncate(c.scrub(cl.Message), 512)
	cl.Code = truncate(c.scrub(cl.Code), 128)
	return &Error{Class: cl, Headers: h, Latency: lat}
}

func (c *Client) transportErr(parent context.Context, err error, timedOut *atomic.Bool, h http.Header, lat time.Duration) *Error {
	if timedOut.Load() {
		err = context.DeadlineExceeded
	} else if perr := parent.Err(); perr != nil {
		err = perr
	}
	return c.fail(ratecontrol.ClassifyError(err), h, lat)
}

func (c *Client) scrub(s string) string {
	for _, secret := range c.secrets {
		s = strings.ReplaceAll(s, secret, "[redacted]")
	}
	return s
}

// scrubBytes removes the key and header values from a provider body before
// anything parses or truncates it (a hostile or buggy provider may echo
// the headers).
func (c *Client) scrubBytes(b []byte) []byte {
	for _, secret := range c.secrets {
		b = bytes.ReplaceAll(b, []byte(secret), []byte("[redacted]"))
	}
	return b
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
