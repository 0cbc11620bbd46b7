package provider

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ratecontrol"
)

// Requests share the client's fixed header; a traced call's traceparent
// goes on its own copy and never onto the shared one.
func TestTracedCallsDoNotMarkTheSharedHeader(t *testing.T) {
	var mu sync.Mutex
	var parents []string
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		parents = append(parents, r.Header.Get("traceparent"))
		mu.Unlock()
		require.Equal(t, "Bearer "+testKey, r.Header.Get("Authorization"))
		require.Equal(t, "application/json", r.Header.Get("Content-Type"))
		fmt.Fprint(w, `{"choices":[{"message":{"content":"x"}}]}`)
	}, nil)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
	})
	traced := trace.ContextWithSpanContext(context.Background(), sc)

	var wg sync.WaitGroup
	for i := range 8 {
		ctx := context.Background()
		if i%2 == 0 {
			ctx = traced
		}
		wg.Go(func() {
			_, err := c.Chat(ctx, "m", []byte(`{"messages":[]}`))
			require.NoError(t, err)
		})
	}
	wg.Wait()
	want := "00-01020300000000000000000000000000-0405060000000000-01"
	var withParent int
	for _, p := range parents {
		if p != "" {
			require.Equal(t, want, p)
			withParent++
		}
	}
	require.Equal(t, 4, withParent, "traceparents sent: %q", parents)
	require.Empty(t, c.fixed.Get("traceparent"), "the shared header was written to")
}

// A provider that redirects gets one request, and the call fails with a
// message that says where it points: a job is not sent again elsewhere.
func TestRedirectIsNotFollowed(t *testing.T) {
	var calls atomic.Int32
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Redirect(w, r, "https://elsewhere.example/v1/chat/completions", http.StatusPermanentRedirect)
	}, nil)
	_, err := c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, ratecontrol.KindClient, pe.Class.Kind)
	require.Equal(t, http.StatusPermanentRedirect, pe.Class.Status)
	require.Contains(t, pe.Class.Message, "https://elsewhere.example/v1/chat/completions")
	require.Contains(t, pe.Class.Message, "base URL")
	require.EqualValues(t, 1, calls.Load())
}

// A transport failure names the request, as http.Client's errors did.
func TestTransportErrorNamesTheRequest(t *testing.T) {
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		hj, ok := w.(http.Hijacker)
		require.True(t, ok)
		conn, _, err := hj.Hijack()
		require.NoError(t, err)
		conn.Close()
	}, nil)
	_, err := c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, ratecontrol.KindTransient, pe.Class.Kind)
	require.Contains(t, pe.Class.Message, `Post "http://`)
	require.Contains(t, pe.Class.Message, "/v1/chat/completions")
}

// BenchmarkChat is one call over a kept-alive connection to a local server
// answering a typical body; the server's work is in the figures too.
func BenchmarkChat(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, typicalChatBody) //nolint:errcheck
	}))
	defer srv.Close()
	c, err := New(Config{BaseURL: srv.URL + "/v1", APIKey: config.Secret(testKey), Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	body := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("My invoice is wrong. ", 45) + `"}],"max_tokens":64}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Chat(context.Background(), "qwen-plus", body); err != nil {
			b.Fatal(err)
		}
	}
}

// A base URL's user:password@ is sent as basic auth when there is no key,
// as http.Client did, and its password is in no message.
func TestBaseURLUserinfoIsBasicAuthAndNeverShown(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Authorization"))
		fmt.Fprint(w, `{"choices":[{"message":{"content":"x"}}]}`)
	}))
	defer srv.Close()
	withUser := strings.Replace(srv.URL, "http://", "http://gw:hunter2-gateway-pass@", 1)
	c, err := New(Config{BaseURL: withUser + "/v1"})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
	require.NoError(t, err)
	require.Equal(t, "Basic Z3c6aHVudGVyMi1nYXRld2F5LXBhc3M=", got.Load())

	srv.Close()
	_, err = c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.NotContains(t, pe.Error(), "hunter2")
	require.NotContains(t, pe.Class.Message, "hunter2")
}

// The built-in headers stay what the client sets; a call's extra headers
// add to them.
func TestExtraHeadersDoNotReplaceTheBuiltIns(t *testing.T) {
	var ct, async atomic.Value
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		ct.Store(r.Header.Get("Content-Type"))
		async.Store(r.Header.Get("X-DashScope-Async"))
		fmt.Fprint(w, `{"choices":[{"message":{"content":"x"}}]}`)
	}, nil)
	extra := http.Header{"Content-Type": {"text/plain"}, "X-Dashscope-Async": {"enable"}}
	_, err := c.send(context.Background(), http.MethodPost, c.url, "m", []byte(`{}`), extra, false, c.readBody)
	require.NoError(t, err)
	require.Equal(t, "application/json", ct.Load())
	require.Equal(t, "enable", async.Load())
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A transport that answers with no body, or with nothing at all, fails
// the call; it does not crash the worker.
func TestTransportWithoutABody(t *testing.T) {
	for name, rt := range map[string]roundTripFunc{
		"no body": func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}}, nil
		},
		"nothing": func(*http.Request) (*http.Response, error) { return nil, nil },
	} {
		c, err := New(Config{BaseURL: "http://provider.invalid/v1", Transport: rt})
		require.NoError(t, err, name)
		_, err = c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
		var pe *Error
		require.ErrorAs(t, err, &pe, name)
		require.NotEqual(t, ratecontrol.KindOK, pe.Class.Kind, name)
	}
}
