package ratecontrol

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// rateLimitInfo is what a provider's rate-limit headers say. A count that
// is absent is -1; a duration that is absent is -1 as well.
type rateLimitInfo struct {
	LimitRequests, RemainingRequests float64
	ResetRequests                    time.Duration
	LimitTokens, RemainingTokens     float64
	ResetTokens                      time.Duration
	// RetryAfter from Retry-After (seconds or HTTP date) or retry-after-ms; 0 = none.
	RetryAfter time.Duration
}

// hasRequests reports whether request headers were present.
func (r rateLimitInfo) hasRequests() bool { return r.RemainingRequests >= 0 }

// hasTokens reports whether token headers were present.
func (r rateLimitInfo) hasTokens() bool { return r.RemainingTokens >= 0 }

// parseRateLimitHeaders reads x-ratelimit-{limit,remaining,reset}-{requests,tokens},
// Retry-After and retry-after-ms. Reset values may be Go/OpenAI durations
// ("6m0s", "1s", "20ms", "7.66s") or plain seconds.
func parseRateLimitHeaders(h http.Header, now time.Time) rateLimitInfo {
	r := rateLimitInfo{LimitRequests: -1, RemainingRequests: -1, ResetRequests: -1,
		LimitTokens: -1, RemainingTokens: -1, ResetTokens: -1}
	if h == nil {
		return r
	}
	r.LimitRequests = headerFloat(h, "X-Ratelimit-Limit-Requests")
	r.RemainingRequests = headerFloat(h, "X-Ratelimit-Remaining-Requests")
	r.ResetRequests = parseResetDuration(h.Get("X-Ratelimit-Reset-Requests"))
	r.LimitTokens = headerFloat(h, "X-Ratelimit-Limit-Tokens")
	r.RemainingTokens = headerFloat(h, "X-Ratelimit-Remaining-Tokens")
	r.ResetTokens = parseResetDuration(h.Get("X-Ratelimit-Reset-Tokens"))
	if ms := h.Get("Retry-After-Ms"); ms != "" {
		if v, err := strconv.ParseFloat(strings.TrimSpace(ms), 64); err == nil && v > 0 {
			r.RetryAfter = clampedDuration(v, time.Millisecond)
		}
	}
	if r.RetryAfter == 0 {
		r.RetryAfter = parseRetryAfter(h.Get("Retry-After"), now)
	}
	return r
}

func headerFloat(h http.Header, k string) float64 {
	v := strings.TrimSpace(h.Get(k))
	if v == "" {
		return -1
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 {
		return -1
	}
	return f
}

// parseResetDuration parses "6m0s", "1s", "20ms", "0.5" (seconds); -1 if
// empty or invalid.
func parseResetDuration(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return -1
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 {
		return clampedDuration(f, time.Second)
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return d
	}
	return -1
}

// parseRetryAfter parses Retry-After as delay-seconds or an HTTP date
// (relative to now); 0 if empty, invalid or in the past.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if !(f > 0) { // also NaN
			return 0
		}
		return clampedDuration(f, time.Second)
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// maxServerDelay caps any delay a provider asks for: a huge or hostile
// header value must not overflow into a negative (ignored) delay.
const maxServerDelay = 24 * time.Hour

// clampedDuration converts v units to a duration in [0, maxServerDelay].
func clampedDuration(v float64, unit time.Duration) time.Duration {
	if !(v > 0) {
		return 0
	}
	if v >= float64(maxServerDelay)/float64(unit) {
		return maxServerDelay
	}
	return time.Duration(v * float64(unit))
}
