package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func put(s http.Handler, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPut, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

func get(s http.Handler, path string, headers ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

func TestCompletionBody(t *testing.T) {
	s := newSim(t, Config{Models: map[string]ModelConfig{"qwen-plus": {}}})
	body := chatBody("qwen-plus", "Summarise ticket 4711", `,"max_tokens":512`)
	for _, path := range []string{"/v1/chat/completions", "/compatible-mode/v1/chat/completions"} {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var c completion
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &c))
		require.Equal(t, "chat.completion", c.Object)
		require.Equal(t, "qwen-plus", c.Model)
		require.Len(t, c.Choices, 1)
		require.Equal(t, "assistant", c.Choices[0].Message.Role)
		require.Equal(t, ExpectedContent([]byte(body)), c.Choices[0].Message.Content)
		// 3 + 4 + ceil(21/4) = 13 input tokens; output from the default mix
		// (30 or 600), capped by max_tokens.
		require.Equal(t, int64(13), c.Usage.PromptTokens)
		require.Contains(t, []int64{30, 512}, c.Usage.CompletionTokens)
		if c.Usage.CompletionTokens == 512 {
			require.Equal(t, "length", *c.Choices[0].FinishReason)
		} else {
			require.Equal(t, "stop", *c.Choices[0].FinishReason)
		}
		require.Equal(t, c.Usage.PromptTokens+c.Usage.CompletionTokens, c.Usage.TotalTokens)
	}
}

func TestOutputMixAndMaxTokens(t *testing.T) {
	s := newSim(t, Config{Output: OutputMix{Short: 30, Long: 600, LongShare: 0.3}, Models: map[string]ModelConfig{"m": {}}})
	long := 0
	const n = 400
	for i := range n {
		body := chatBody("m", strings.Repeat("x", i), "")
		var c completion
		rec := post(s, body)
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &c))
		if c.Usage.CompletionTokens == 600 {
			long++
		}
		// Same request, same length: deterministic.
		var again completion
		require.NoError(t, json.Unmarshal(post(s, body).Body.Bytes(), &again))
		require.Equal(t, c.Usage, again.Usage)
	}
	require.InDelta(t, 0.3, float64(long)/n, 0.08)
	var c completion
	require.NoError(t, json.Unmarshal(post(s, chatBody("m", "hi", `,"max_tokens":7`)).Body.Bytes(), &c))
	require.Equal(t, int64(7), c.Usage.CompletionTokens)
	require.Equal(t, "length", *c.Choices[0].FinishReason)
}

func TestExpectedContentIsCanonical(t *testing.T) {
	a := []byte(`{"model":"a","messages":[{"role":"user","content":"hello"}]}`)
	b := []byte(`{ "messages" : [ { "content":"hello", "role":"user" } ], "model":"b", "max_tokens": 9 }`)
	c := []byte(`{"model":"a","messages":[{"role":"user","content":"hello!"}]}`)
	parts := []byte(`{"model":"a","messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}`)
	require.Equal(t, ExpectedContent(a), ExpectedContent(parts))
	require.Equal(t, ExpectedContent(a), ExpectedContent(b))
	require.NotEqual(t, ExpectedContent(a), ExpectedContent(c))
	require.True(t, strings.HasPrefix(ExpectedContent(a), "llmsim reply "))
	require.Empty(t, ExpectedContent([]byte(`not json`)))
}

func TestEstimateInputTokens(t *testing.T) {
	n, err := EstimateInputTokens([]byte(`{"model":"m","messages":[
		{"role":"system","content":"12345678"},
		{"role":"user","content":[{"type":"text","text":"abcde"},{"type":"image_url","image_url":{"url":"x"}}]},
		{"role":"assistant","content":null,"tool_calls":[]}]}`))
	require.NoError(t, err)
	// 3 + (4 + 2) + (4 + 2) + (4 + 0)
	require.Equal(t, int64(19), n)
	_, err = EstimateInputTokens([]byte(`{"model":"m","messages":[{"role":"user","content":5}]}`))
	require.Error(t, err)
}

func TestBadRequests(t *testing.T) {
	s := newSim(t, oneModel(ModelConfig{}))
	for name, body := range map[string]string{
		"bad json":    `{"model":`,
		"no messages": `{"model":"m","messages":[]}`,
		"no role":     `{"model":"m","messages":[{"content":"x"}]}`,
		"bad content": `{"model":"m","messages":[{"role":"user","content":{}}]}`,
		"not object":  `{"model":"m","messages":["x"]}`,
		"no model":    `{"messages":[{"role":"user","content":"x"}]}`,
		"max_tokens":  `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}`,
	} {
		t.Run(name, func(t *testing.T) {
			rec := post(s, body)
			requireCode(t, rec, http.StatusBadRequest, "invalid_parameter_error")
			require.Equal(t, "invalid_request_error", decodeErr(t, rec).Error.Type)
		})
	}
	rec := post(s, chatBody("gpt-nope", "hi", ""))
	requireCode(t, rec, http.StatusNotFound, "model_not_found")
	require.Contains(t, decodeErr(t, rec).Error.Message, "gpt-nope")
	require.Equal(t, http.StatusNotFound, get(s, "/v2/other").Code)
	require.Equal(t, http.StatusMethodNotAllowed, get(s, "/v1/chat/completions").Code)
}

func TestAuth(t *testing.T) {
	cfg := oneModel(ModelConfig{})
	cfg.APIKeys = []string{"sk-good", "sk-other"}
	s := newSim(t, cfg)
	for name, hdr := range map[string]string{"none": "", "wrong": "Bearer sk-wrong-secret", "scheme": "Basic sk-good"} {
		t.Run(name, func(t *testing.T) {
			var rec *httptest.ResponseRecorder
			if hdr == "" {
				rec = hi(s)
			} else {
				rec = hi(s, "Authorization", hdr)
			}
			requireCode(t, rec, http.StatusUnauthorized, "invalid_api_key")
			require.NotContains(t, rec.Body.String(), "sk-")
			require.Equal(t, http.StatusUnauthorized, get(s, "/admin/stats", "Authorization", hdr).Code)
		})
	}
	requireCode(t, hi(s, "Authorization", "Bearer sk-good"), http.StatusOK, "")
	requireCode(t, hi(s, "Authorization", "Bearer sk-other"), http.StatusOK, "")
	require.Equal(t, http.StatusOK, get(s, "/admin/stats", "Authorization", "Bearer sk-good").Code)
	require.Equal(t, http.StatusOK, get(s, "/metrics").Code)
	require.Equal(t, http.StatusOK, get(s, "/healthz").Code)
}

// sse reads a streamed reply into its data payloads.
func sse(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		require.True(t, ok, "line %q", line)
		out = append(out, data)
	}
	require.NoError(t, sc.Err())
	return out
}

func TestStreamingWithUsage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := ModelConfig{Latency: &LatencyConfig{TTFT: Duration(200 * time.Millisecond), TPT: Duration(10 * time.Millisecond)}}
		s := newSim(t, oneModel(m))
		body := chatBody("m", "hi", `,"stream":true,"stream_options":{"include_usage":true}`)
		start := time.Now()
		rec := post(s, body)
		// TTFT + 10 output tokens × TPT, on the virtual clock.
		require.Equal(t, 300*time.Millisecond, time.Since(start))
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, "text/event-stream", rec.Header().Get("Content-Type"))
		events := sse(t, rec.Body)
		require.Equal(t, "[DONE]", events[len(events)-1])
		var content strings.Builder
		var finish string
		var u *usage
		for _, e := range events[:len(events)-1] {
			var c completion
			require.NoError(t, json.Unmarshal([]byte(e), &c))
			require.Equal(t, "chat.completion.chunk", c.Object)
			for _, ch := range c.Choices {
				content.WriteString(ch.Delta.Content)
				if ch.FinishReason != nil {
					finish = *ch.FinishReason
				}
			}
			if c.Usage != nil {
				require.Empty(t, c.Choices)
				u = c.Usage
			}
		}
		require.Equal(t, ExpectedContent([]byte(body)), content.String())
		require.Equal(t, "stop", finish)
		require.NotNil(t, u)
		require.Equal(t, usage{PromptTokens: 8, CompletionTokens: 10, TotalTokens: 18}, *u)

		// Without include_usage there is no usage chunk.
		events = sse(t, post(s, chatBody("m", "hi", `,"stream":true`)).Body)
		for _, e := range events[:len(events)-1] {
			require.NotContains(t, e, `"usage"`)
		}
	})
}

func TestLatencyRisesAboveCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := ModelConfig{Latency: &LatencyConfig{TPT: Duration(10 * time.Millisecond), Capacity: 1}}
		s := newSim(t, oneModel(m))
		done := make(chan time.Duration, 2)
		start := time.Now()
		for range 2 {
			go func() {
				hi(s)
				done <- time.Since(start)
			}()
		}
		a, b := <-done, <-done
		// The first runs alone (10 × 10ms); the second is admitted with 2 in
		// flight above a capacity of 1, so its TPT doubles.
		require.Equal(t, 100*time.Millisecond, min(a, b))
		require.Equal(t, 200*time.Millisecond, max(a, b))
	})
}

func TestWaitTimeoutQueuesBurstOnly(t *testing.T) {
	burst := ModelConfig{Burst: BurstConfig{Floor: 1}, MaxResponseTime: Duration(10 * time.Second)}
	t.Run("queued until the rule admits", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newSim(t, oneModel(burst))
			requireCode(t, hi(s), http.StatusOK, "")
			start := time.Now()
			requireCode(t, hi(s, "X-DashScope-Wait-Timeout", "5"), http.StatusOK, "")
			require.Equal(t, time.Second, time.Since(start)) // the first request left the 1 s window
			st := s.Stats().Models["m"]
			require.Equal(t, int64(1), st.Queued)
			require.Equal(t, int64(1), st.QueueAdmitted)
			require.Zero(t, st.RateLimitedTotal)
		})
	})
	t.Run("queue times out", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newSim(t, oneModel(burst))
			requireCode(t, hi(s), http.StatusOK, "")
			start := time.Now()
			requireCode(t, hi(s, "X-DashScope-Wait-Timeout", "0.25"), http.StatusTooManyRequests, "limit_burst_rate")
			require.Equal(t, 250*time.Millisecond, time.Since(start))
		})
	})
	for name, hdr := range map[string]string{"zero": "0", "at max response time": "10", "above": "60", "junk": "soon"} {
		t.Run(name+" is immediate", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newSim(t, oneModel(burst))
				requireCode(t, hi(s), http.StatusOK, "")
				start := time.Now()
				requireCode(t, hi(s, "X-DashScope-Wait-Timeout", hdr), http.StatusTooManyRequests, "limit_burst_rate")
				require.Zero(t, time.Since(start))
				require.Zero(t, s.Stats().Models["m"].Queued)
			})
		})
	}
	t.Run("rpm is never queued", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newSim(t, oneModel(ModelConfig{RPM: 1, Burst: BurstConfig{Floor: 1}}))
			requireCode(t, hi(s), http.StatusOK, "")
			time.Sleep(2 * time.Second)
			start := time.Now()
			requireCode(t, hi(s, "X-DashScope-Wait-Timeout", "30"), http.StatusTooManyRequests, "limit_requests")
			require.Zero(t, time.Since(start))
		})
	})
	t.Run("client leaves while queued", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newSim(t, oneModel(burst))
			requireCode(t, hi(s), http.StatusOK, "")
			ctx, cancel := context.WithCancel(t.Context())
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody("m", "hi", ""))).WithContext(ctx)
			req.Header.Set("X-DashScope-Wait-Timeout", "5")
			done := make(chan struct{})
			go func() {
				defer close(done)
				s.ServeHTTP(httptest.NewRecorder(), req)
			}()
			synctest.Wait()
			cancel()
			<-done
			require.Equal(t, int64(1), s.Stats().Models["m"].Cancelled)
		})
	})
}

func TestCloseReleasesHangingRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := oneModel(ModelConfig{})
		cfg.Faults = FaultConfig{TimeoutRate: 1}
		s := newSim(t, cfg)
		done := make(chan int)
		go func() { done <- hi(s).Code }()
		synctest.Wait()
		require.Equal(t, int64(1), s.Stats().Models["m"].InFlight)
		s.Close()
		require.Equal(t, http.StatusServiceUnavailable, <-done)
		require.Zero(t, s.Stats().Models["m"].InFlight)
	})
}
