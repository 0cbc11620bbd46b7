package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/llmq/llmq/internal/ratecontrol"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

const testKey = "sk-test-0123456789abcdef"

func TestSetTopLevel(t *testing.T) {
	cases := []struct{ name, in, key, val, want string }{
		{"replace", `{"model":"x","messages":[]}`, "model", `"qwen"`, `{"model":"qwen","messages":[]}`},
		{"replace keeps spacing", "{ \"messages\" : [1, 2],\n  \"model\" : \"old\" }", "model", `"m"`, "{ \"messages\" : [1, 2],\n  \"model\" : \"m\" }"},
		{"insert", `{"messages":[{"role":"user","content":"hi"}]}`, "model", `"m"`, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{"insert into empty", `{}`, "model", `"m"`, `{"model":"m"}`},
		{"nested model untouched", `{"tools":[{"model":"inner"}],"x":{"model":1}}`, "model", `"m"`, `{"model":"m","tools":[{"model":"inner"}],"x":{"model":1}}`},
		{"string containing braces", `{"a":"}{\"model\":","model":null}`, "model", `"m"`, `{"a":"}{\"model\":","model":"m"}`},
		{"numbers kept", `{"temperature":0.70,"max_tokens":1e2}`, "stream", `true`, `{"stream":true,"temperature":0.70,"max_tokens":1e2}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := SetTopLevel([]byte(c.in), c.key, []byte(c.val))
			require.NoError(t, err)
			require.Equal(t, c.want, string(got))
			require.True(t, json.Valid(got))
		})
	}
	for _, bad := range []string{``, `[]`, `"x"`, `{"a":`, `{"a":"unterminated}`} {
		_, err := SetTopLevel([]byte(bad), "model", []byte(`"m"`))
		require.Error(t, err, bad)
	}
}

func newClient(t *testing.T, h http.HandlerFunc, mod func(*Config)) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	cfg := Config{BaseURL: srv.URL + "/v1", APIKey: config.Secret(testKey), Timeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

func TestChatPassThrough(t *testing.T) {
	var gotBody []byte
	var gotHeader http.Header
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, "/v1/chat/completions", r.URL.Path)
		gotBody, _ = io.ReadAll(r.Body)
		gotHeader = r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("x-ratelimit-remaining-requests", "99")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`)
	}, func(c *Config) { c.WaitTimeout = 30 * time.Second })

	req := `{"messages":[{"role":"user","content":"hi"}],  "model":"ignored", "temperature":0.50}`
	resp, err := c.Chat(context.Background(), "qwen-plus", []byte(req))
	require.NoError(t, err)
	require.Equal(t, `{"messages":[{"role":"user","content":"hi"}],  "model":"qwen-plus", "temperature":0.50}`, string(gotBody))
	require.Equal(t, "Bearer "+testKey, gotHeader.Get("Authorization"))
	require.Equal(t, "30", gotHeader.Get("X-DashScope-Wait-Timeout"))
	require.Equal(t, "hello", resp.Content)
	require.Equal(t, 7, resp.PromptTokens)
	require.Equal(t, 3, resp.CompletionTokens)
	require.Equal(t, "99", resp.Headers.Get("x-ratelimit-remaining-requests"))
	require.JSONEq(t, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`, string(resp.Body))
}

func TestChatNoWaitHeaderByDefault(t *testing.T) {
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		require.Empty(t, r.Header.Get("X-DashScope-Wait-Timeout"))
		fmt.Fprint(w, `{"choices":[{"message":{"content":"x"}}]}`)
	}, nil)
	_, err := c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
	require.NoError(t, err)
}

func TestChatStreaming(t *testing.T) {
	var gotBody map[string]any
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, json.NewDecoder(r.Body).Decode(&gotBody))
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ch := range []string{
			`{"id":"s1","created":5,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}`,
			`{"id":"s1","created":5,"model":"m","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}`,
			`{"id":"s1","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`,
			`[DONE]`,
		} {
			fmt.Fprintf(w, "data: %s\n\n", ch)
			w.(http.Flusher).Flush()
		}
	}, func(c *Config) { c.Stream = true })
	resp, err := c.Chat(context.Background(), "m", []byte(`{"messages":[{"role":"user","content":"x"}]}`))
	require.NoError(t, err)
	require.Equal(t, true, gotBody["stream"])
	require.Equal(t, map[string]any{"include_usage": true}, gotBody["stream_options"])
	require.Equal(t, "Hello", resp.Content)
	require.Equal(t, 4, resp.PromptTokens)
	require.Equal(t, 2, resp.CompletionTokens)
	var body struct {
		Object  string
		Choices []struct {
			Message struct{ Content string }
		}
	}
	require.NoError(t, json.Unmarshal(resp.Body, &body))
	require.Equal(t, "chat.completion", body.Object)
	require.Equal(t, "Hello", body.Choices[0].Message.Content)
}

func TestChatStreamTruncated(t *testing.T) {
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n")
	}, func(c *Config) { c.Stream = true })
	_, err := c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, ratecontrol.KindTransient, pe.Class.Kind)
}

func TestChatErrorsClassified(t *testing.T) {
	cases := []struct {
		name   string
		status int
		body   string
		kind   ratecontrol.Kind
	}{
		{"dashscope rpm", 429, `{"code":"Throttling.RateQuota","message":"Requests rate limit exceeded"}`, ratecontrol.KindRateLimitRequests},
		{"openai tpm", 429, `{"error":{"message":"tokens","type":"requests","code":"insufficient_quota"}}`, ratecontrol.KindRateLimitTokens},
		{"burst", 429, `{"error":{"message":"burst","code":"limit_burst_rate"}}`, ratecontrol.KindRateLimitBurst},
		{"5xx", 503, `{"error":{"message":"overloaded"}}`, ratecontrol.KindServer},
		{"bad request", 400, `{"error":{"message":"bad","type":"invalid_request_error"}}`, ratecontrol.KindClient},
		{"model not found", 404, `{"error":{"message":"no such model","code":"model_not_found"}}`, ratecontrol.KindClient},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "2")
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.body)
			}, nil)
			_, err := c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
			var pe *Error
			require.ErrorAs(t, err, &pe)
			require.Equal(t, tc.kind, pe.Class.Kind, pe.Error())
			require.Equal(t, tc.status, pe.Class.Status)
			require.Equal(t, "2", pe.Headers.Get("Retry-After"))
		})
	}
}

func TestKeyNeverEchoed(t *testing.T) {
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		// A hostile provider echoing the Authorization header in its error.
		w.WriteHeader(401)
		fmt.Fprintf(w, `{"error":{"message":"invalid key %s (%s)","code":"%s"}}`, r.Header.Get("Authorization"), testKey, testKey)
	}, nil)
	_, err := c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
	require.Error(t, err)
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.NotContains(t, err.Error(), testKey)
	require.NotContains(t, pe.Class.Message, testKey)
	require.NotContains(t, pe.Class.Code, testKey)
	require.NotContains(t, fmt.Sprintf("%+v %#v", pe, pe), testKey)
}

func TestBodyCap(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"}}]}\n\n", strings.Repeat("a", 2<<20))
					return
				}
				fmt.Fprintf(w, `{"choices":[{"message":{"content":"%s"}}]}`, strings.Repeat("a", 2<<20))
			}, func(c *Config) { c.MaxBodyBytes = 1 << 20; c.Stream = stream })
			_, err := c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
			var pe *Error
			require.ErrorAs(t, err, &pe)
			require.Contains(t, pe.Error(), "size limit")
		})
	}
}

func TestTimeoutClassified(t *testing.T) {
	release := make(chan struct{})
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server watches the connection only once the body is read
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}, func(c *Config) { c.Timeout = 50 * time.Millisecond })
	defer close(release)
	_, err := c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, ratecontrol.KindTransient, pe.Class.Kind)
	require.Equal(t, "timeout", pe.Class.Code)
}

func TestCallerCancel(t *testing.T) {
	started := make(chan struct{})
	release := make(chan struct{})
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		close(started)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}, nil)
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	_, err := c.Chat(ctx, "m", []byte(`{"messages":[]}`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, ratecontrol.KindCanceled, pe.Class.Kind)
}

func TestConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c, err := New(Config{BaseURL: url + "/v1"})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
	var pe *Error
	require.True(t, errors.As(err, &pe))
	require.Equal(t, ratecontrol.KindTransient, pe.Class.Kind)
}

func TestBadRequestBody(t *testing.T) {
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) { t.Error("must not be called") }, nil)
	_, err := c.Chat(context.Background(), "m", []byte(`[1,2]`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, ratecontrol.KindClient, pe.Class.Kind)
}

// BenchmarkSetTopLevel sets the model of a 1 KB chat request, as every
// call does.
func BenchmarkSetTopLevel(b *testing.B) {
	body := []byte(`{"messages":[{"role":"system","content":"Classify the ticket."},{"role":"user","content":"` +
		strings.Repeat("My invoice is wrong. ", 45) + `"}],"temperature":0.2,"max_tokens":64}`)
	for b.Loop() {
		if _, err := SetTopLevel(body, "model", []byte(`"qwen-plus"`)); err != nil {
			b.Fatal(err)
		}
	}
}
