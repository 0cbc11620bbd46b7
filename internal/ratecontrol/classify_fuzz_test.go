package ratecontrol

import (
	"net/http"
	"testing"
	"time"
)

// FuzzClassify feeds Classify arbitrary statuses, headers and bodies: it
// never panics, a 2xx is never classified as an error, a 429 is always
// rate limited, a 5xx always retryable, a sane Retry-After never yields a
// negative delay, and the message stays bounded.
func FuzzClassify(f *testing.F) {
	seeds := []struct {
		status     int
		retryAfter string
		body       string
	}{
		{200, "", `{"choices":[]}`},
		{204, "", ""},
		{429, "2", `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`},
		{429, "", `{"code":"Throttling.AllocationQuota","message":"Allocated quota exceeded","request_id":"x"}`},
		{429, "Wed, 21 Oct 2015 07:28:00 GMT", `{"code":"Throttling.BurstRate"}`},
		{429, "-1", `not json`},
		{429, "", `{"error":{"code":12,"message":null}}`},
		{400, "", `{"error":{"message":"bad","code":"invalid_request_error"}}`},
		{401, "", `{"error":{"message":"Incorrect API key provided: sk-abcdef1234567890"}}`},
		{500, "", `{"error":{"message":"boom"}}`},
		{503, "99999999999999999999", ``},
		{0, "", ""},
		{999, "", "\xff\xfe"},
	}
	for _, s := range seeds {
		f.Add(s.status, s.retryAfter, []byte(s.body))
	}
	now := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, status int, retryAfter string, body []byte) {
		h := http.Header{}
		if retryAfter != "" {
			h.Set("Retry-After", retryAfter)
			h.Set("retry-after-ms", retryAfter)
		}
		c := ClassifyAt(now, status, h, body)
		switch {
		case status >= 200 && status < 300:
			if c.Kind != KindOK {
				t.Fatalf("status %d classified %s", status, c.Kind)
			}
		case status == http.StatusTooManyRequests:
			if !c.Kind.RateLimited() {
				t.Fatalf("429 classified %s (body %q)", c.Kind, body)
			}
		case status >= 500 && status < 600:
			if !c.Kind.Retryable() {
				t.Fatalf("%d classified %s, not retryable", status, c.Kind)
			}
		}
		// Any header value, however large, gives a delay in [0, maxServerDelay].
		if c.RetryAfter < 0 || c.RetryAfter > maxServerDelay {
			t.Fatalf("RetryAfter %s out of range from %q", c.RetryAfter, retryAfter)
		}
		if len(c.Message) > 4096 {
			t.Fatalf("message of %d bytes is not bounded", len(c.Message))
		}
	})
}
