package ratecontrol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func dashscope(code, msg string) string {
	return fmt.Sprintf(`{"request_id":"b2b0a7c2-0000","code":%q,"message":%q}`, code, msg)
}

func compatible(code, msg string) string {
	return fmt.Sprintf(`{"error":{"message":%q,"type":%q,"param":null,"code":%q},"id":"chatcmpl-1"}`, msg, code, code)
}

func openai(typ, code, msg string) string {
	return fmt.Sprintf(`{"error":{"message":%q,"type":%q,"param":null,"code":%q}}`, msg, typ, code)
}

// TestClassifyGuideTable covers every row of the guide's "Error diagnosis and
// strategy recommendations" table (docs/design.md#classification) in both
// dialects.
func TestClassifyGuideTable(t *testing.T) {
	rows := []struct {
		row        string // the guide's triggering dimension
		dashscope  string
		compatible string
		want       Kind
	}{
		{"RPM exceeded", "Throttling.RateQuota", "limit_requests", KindRateLimitRequests},
		{"RPS exceeded", "Throttling.RateQuota", "limit_requests", KindRateLimitRequests},
		{"TPM exceeded", "Throttling.AllocationQuota", "insufficient_quota", KindRateLimitTokens},
		{"TPS exceeded", "Throttling.AllocationQuota", "insufficient_quota", KindRateLimitTokens},
		{"Traffic burst", "Throttling.BurstRate", "limit_burst_rate", KindRateLimitBurst},
	}
	for _, r := range rows {
		for dialect, body := range map[string]string{
			"dashscope":  dashscope(r.dashscope, "Requests rate limit exceeded, please try again later."),
			"compatible": compatible(r.compatible, "You exceeded your current quota, please try again later."),
		} {
			t.Run(r.row+"/"+dialect, func(t *testing.T) {
				c := Classify(http.StatusTooManyRequests, nil, []byte(body))
				if c.Kind != r.want || !c.Kind.RateLimited() || !c.Kind.Retryable() {
					t.Fatalf("kind %v, want %v (%+v)", c.Kind, r.want, c)
				}
				if c.Code == "" || c.Message == "" || c.Status != 429 {
					t.Fatalf("code/message/status lost: %+v", c)
				}
			})
		}
	}
}

func TestClassify(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	h := func(kv ...string) http.Header {
		hh := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			hh.Set(kv[i], kv[i+1])
		}
		return hh
	}
	cases := []struct {
		name       string
		status     int
		h          http.Header
		body       string
		want       Kind
		retryAfter time.Duration
	}{
		{"ok", 200, nil, `{"choices":[]}`, KindOK, 0},
		{"dashscope generic throttling", 429, nil, dashscope("Throttling", "Requests throttling triggered."), KindRateLimit, 0},
		{"openai tpm by type", 429, nil, openai("tokens", "rate_limit_exceeded", "Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000."), KindRateLimitTokens, 0},
		{"openai rpm by type", 429, nil, openai("requests", "rate_limit_exceeded", "Rate limit reached for gpt-4o on requests per min (RPM): Limit 500."), KindRateLimitRequests, 0},
		{"openai rate_limit_exceeded by message", 429, nil, openai("", "rate_limit_exceeded", "Rate limit reached on tokens per min (TPM)"), KindRateLimitTokens, 0},
		{"openai type rate_limit_exceeded", 429, nil, `{"error":{"message":"slow down","type":"rate_limit_exceeded","code":null}}`, KindRateLimit, 0},
		{"openai billing quota is permanent", 429, nil, openai("insufficient_quota", "insufficient_quota", "You exceeded your current quota, please check your plan and billing details."), KindClient, 0},
		{"bare 429 with exhausted token header", 429, h("X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Reset-Tokens", "6m0s"), "", KindRateLimitTokens, 6 * time.Minute},
		{"bare 429 retry-after seconds", 429, h("Retry-After", "7"), "too many", KindRateLimit, 7 * time.Second},
		{"retry-after http date", 429, h("Retry-After", now.Add(90*time.Second).Format(http.TimeFormat)), "", KindRateLimit, 90 * time.Second},
		{"retry-after-ms", 429, h("Retry-After-Ms", "1500", "Retry-After", "9"), "", KindRateLimit, 1500 * time.Millisecond},
		{"reset-requests fallback", 429, h("X-Ratelimit-Reset-Requests", "20ms"), dashscope("Throttling.RateQuota", "x"), KindRateLimitRequests, 20 * time.Millisecond},
		{"500", 500, nil, dashscope("InternalError", "An internal error has occured"), KindServer, 0},
		{"502 html", 502, nil, "<html>bad gateway</html>", KindServer, 0},
		{"503", 503, nil, "", KindServer, 0},
		{"408", 408, nil, "", KindTransient, 0},
		{"400 bad request", 400, nil, dashscope("InvalidParameter", "Range of max_tokens should be [1, 8192]"), KindClient, 0},
		{"400 data inspection", 400, nil, dashscope("DataInspectionFailed", "Input data may contain inappropriate content."), KindClient, 0},
		{"401", 401, nil, openai("invalid_request_error", "invalid_api_key", "Incorrect API key provided: sk-abcd1234efgh5678."), KindClient, 0},
		{"404 model", 404, nil, compatible("model_not_found", "The model `qwen-x` does not exist"), KindClient, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ClassifyAt(now, tc.status, tc.h, []byte(tc.body))
			if c.Kind != tc.want {
				t.Fatalf("kind %v, want %v (%+v)", c.Kind, tc.want, c)
			}
			if c.RetryAfter != tc.retryAfter {
				t.Fatalf("retry after %v, want %v", c.RetryAfter, tc.retryAfter)
			}
			if strings.Contains(c.Error(), "sk-abcd") {
				t.Fatalf("key leaked: %s", c.Error())
			}
		})
	}
	if KindClient.Retryable() || KindOK.RateLimited() || !KindServer.Retryable() || !KindTransient.Retryable() {
		t.Fatal("Retryable/RateLimited wrong")
	}
}

func TestClassifyError(t *testing.T) {
	opErr := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	cases := []struct {
		err  error
		want Kind
	}{
		{nil, KindOK},
		{context.DeadlineExceeded, KindTransient},
		{fmt.Errorf("call: %w", context.DeadlineExceeded), KindTransient},
		{context.Canceled, KindCanceled},
		{&url.Error{Op: "Post", URL: "http://x", Err: opErr}, KindTransient},
		{&url.Error{Op: "Post", URL: "http://x", Err: syscall.ECONNRESET}, KindTransient},
		{io.EOF, KindTransient},
		{io.ErrUnexpectedEOF, KindTransient},
		{timeoutErr{}, KindTransient},
		{errors.New("tls: handshake failure"), KindTransient},
	}
	for _, tc := range cases {
		if got := ClassifyError(tc.err); got.Kind != tc.want {
			t.Errorf("ClassifyError(%v) = %v, want %v", tc.err, got.Kind, tc.want)
		}
	}
	if KindCanceled.Retryable() {
		t.Error("our own cancellation is not the provider's fault")
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string { return "i/o timeout" }

func (timeoutErr) Timeout() bool { return true }

func (timeoutErr) Temporary() bool { return true }

func TestParseRateLimitHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("x-ratelimit-limit-requests", "600")
	h.Set("x-ratelimit-remaining-requests", "599")
	h.Set("x-ratelimit-reset-requests", "100ms")
	h.Set("x-ratelimit-limit-tokens", "1000000")
	h.Set("x-ratelimit-remaining-tokens", "999000")
	h.Set("x-ratelimit-reset-tokens", "1m0.5s")
	r := parseRateLimitHeaders(h, time.Now())
	want := rateLimitInfo{LimitRequests: 600, RemainingRequests: 599, ResetRequests: 100 * time.Millisecond,
		LimitTokens: 1e6, RemainingTokens: 999000, ResetTokens: 60500 * time.Millisecond}
	if r != want {
		t.Fatalf("got %+v\nwant %+v", r, want)
	}
	for in, want := range map[string]time.Duration{"6m0s": 6 * time.Minute, "1s": time.Second, "20ms": 20 * time.Millisecond,
		"7.66s": 7660 * time.Millisecond, "2": 2 * time.Second, "": -1, "soon": -1} {
		if got := parseResetDuration(in); got != want {
			t.Errorf("parseResetDuration(%q) = %v, want %v", in, got, want)
		}
	}
	if e := parseRateLimitHeaders(nil, time.Now()); e.hasRequests() || e.hasTokens() {
		t.Error("nil headers have no info")
	}
}

func TestBackoff(t *testing.T) {
	fixed := func(v float64) func() float64 { return func() float64 { return v } }
	b := Backoff{Base: time.Second, Max: 10 * time.Second, Rand: fixed(0.999999)}
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 8 * time.Second, 5: 10 * time.Second, 50: 10 * time.Second} {
		if got := b.Delay(attempt, 0); got > want || got < want*99/100 {
			t.Errorf("attempt %d: %v, want just under %v", attempt, got, want)
		}
	}
	b.Rand = fixed(0)
	if got := b.Delay(3, 0); got != 0 {
		t.Errorf("full jitter lower bound %v", got)
	}
	if got := b.Delay(1, 30*time.Second); got != 30*time.Second {
		t.Errorf("retry-after floor: %v", got)
	}
	b.Rand = fixed(0.5)
	if got := b.Delay(1, 30*time.Second); got != 30*time.Second+500*time.Millisecond {
		t.Errorf("retry-after with jitter: %v", got)
	}
	if got := (Backoff{}).Delay(1, 0); got < 0 || got > time.Second {
		t.Errorf("defaults: %v", got)
	}
}

func TestEstimateTokens(t *testing.T) {
	cases := []struct {
		body string
		want int
	}{
		{`{"messages":[{"role":"user","content":"Hello"}]}`, 3 + 4 + 1 + 2},
		{`{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"0123456789abcdef"}]}]}`, 3 + (4 + 2 + 3) + (4 + 1 + 4)},
		{`{"messages":[{"role":"user","content":"你好世界"}]}`, 3 + 4 + 1 + 4},
		{`not json at all`, 3 + 4},
	}
	for _, tc := range cases {
		if got := EstimateTokens([]byte(tc.body)); got != tc.want {
			t.Errorf("EstimateTokens(%s) = %d, want %d", tc.body, got, tc.want)
		}
	}
}

func TestRetryAfterIsClamped(t *testing.T) {
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for _, v := range []string{"1e20", "9223372037", "NaN", "-5", "Inf"} {
		d := parseRetryAfter(v, now)
		if d < 0 || d > maxServerDelay {
			t.Errorf("Retry-After %q → %s", v, d)
		}
	}
	if d := parseRetryAfter("1e20", now); d != maxServerDelay {
		t.Errorf("huge Retry-After → %s, want the %s cap", d, maxServerDelay)
	}
	h := http.Header{"Retry-After-Ms": {"1e30"}}
	if d := parseRateLimitHeaders(h, now).RetryAfter; d != maxServerDelay {
		t.Errorf("huge retry-after-ms → %s", d)
	}
}
