package ratecontrol

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Kind is the class of a call's outcome (docs/design.md#classification).
type Kind int

// Kinds of outcome.
const (
	KindOK                Kind = iota // success
	KindRateLimitRequests             // RPM/RPS exceeded (Throttling.RateQuota / limit_requests)
	KindRateLimitTokens               // TPM/TPS exceeded (Throttling.AllocationQuota / insufficient_quota on 429)
	KindRateLimitBurst                // growth rate exceeded (Throttling.BurstRate / limit_burst_rate)
	KindRateLimit                     // rate limited, dimension unknown (Throttling, rate_limit_exceeded, bare 429)
	KindServer                        // 5xx: retryable with backoff
	KindTransient                     // timeout or connection failure: retryable
	KindClient                        // 4xx other than 429: permanent
	KindCanceled                      // our own context was cancelled: not the provider's fault
)

var kindNames = [...]string{"ok", "rate_limit_requests", "rate_limit_tokens", "rate_limit_burst",
	"rate_limit", "server", "transient", "client", "canceled"}

func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// RateLimited reports a 429-class outcome (the one that triggers fallback).
func (k Kind) RateLimited() bool {
	return k == KindRateLimitRequests || k == KindRateLimitTokens || k == KindRateLimitBurst || k == KindRateLimit
}

// Retryable reports whether the same call may succeed later.
func (k Kind) Retryable() bool {
	return k.RateLimited() || k == KindServer || k == KindTransient
}

// Classification is the diagnosis of one call outcome. Message comes from
// the provider's body (truncated, with anything looking like a key
// redacted); request headers never reach it.
type Classification struct {
	Kind       Kind
	Code       string // provider code: "Throttling.RateQuota", "limit_requests", …
	Message    string
	RetryAfter time.Duration // from Retry-After / retry-after-ms / x-ratelimit-reset-*; 0 = none
	Status     int
}

// Error makes a Classification usable as an error.
func (c Classification) Error() string {
	s := c.Kind.String()
	if c.Status != 0 {
		s += " (status " + strconv.Itoa(c.Status) + ")"
	}
	if c.Code != "" {
		s += ": " + c.Code
	}
	if c.Message != "" {
		s += ": " + c.Message
	}
	return s
}

// errorBody covers both dialects: DashScope native {"code","message"} and
// OpenAI(-compatible) {"error":{"code","type","message"}}.
type errorBody struct {
	Code    json.RawMessage `json:"code"`
	Message string          `json:"message"`
	Error   *struct {
		Code    json.RawMessage `json:"code"`
		Type    string          `json:"type"`
		Message string          `json:"message"`
	} `json:"error"`
}

func rawString(r json.RawMessage) string {
	var s string
	if json.Unmarshal(r, &s) == nil {
		return s
	}
	return strings.Trim(string(r), `"`) // numeric codes
}

// codeKinds maps provider codes (both dialects) to kinds.
var codeKinds = map[string]Kind{
	"throttling.ratequota":       KindRateLimitRequests,
	"limit_requests":             KindRateLimitRequests,
	"throttling.allocationquota": KindRateLimitTokens,
	"limit_tokens":               KindRateLimitTokens,
	"throttling.burstrate":       KindRateLimitBurst,
	"limit_burst_rate":           KindRateLimitBurst,
	"throttling":                 KindRateLimit,
	"rate_limit_exceeded":        KindRateLimit,
	"ratelimitexceeded":          KindRateLimit,
	"requests":                   KindRateLimitRequests, // OpenAI type on RPM
	"tokens":                     KindRateLimitTokens,   // OpenAI type on TPM
}

// Classify diagnoses an HTTP response from its status, headers and body.
func Classify(status int, h http.Header, body []byte) Classification {
	return ClassifyAt(time.Now(), status, h, body)
}

// ClassifyAt is Classify with the time used to read HTTP-date Retry-After.
func ClassifyAt(now time.Time, status int, h http.Header, body []byte) Classification {
	c := Classification{Status: status}
	if status >= 200 && status < 300 { // success bodies are not parsed
		return c
	}
	var eb errorBody
	var typ string
	if len(body) > 0 && json.Unmarshal(body, &eb) == nil {
		c.Code, c.Message = rawString(eb.Code), eb.Message
		if eb.Error != nil {
			if code := rawString(eb.Error.Code); code != "" {
				c.Code = code
			}
			typ = eb.Error.Type
			if eb.Error.Message != "" {
				c.Message = eb.Error.Message
			}
		}
	}
	c.Message = redact(c.Message)
	info := parseRateLimitHeaders(h, now)
	c.RetryAfter = info.RetryAfter

	lcode, ltyp := strings.ToLower(c.Code), strings.ToLower(typ)
	kind, known := codeKinds[lcode]
	if tk, ok := codeKinds[ltyp]; ok && (!known || kind == KindRateLimit) {
		kind, known = tk, true // OpenAI: code rate_limit_exceeded, type tokens/requests
	}
	switch {
	case lcode == "insufficient_quota" || ltyp == "insufficient_quota":
		// DashScope's compatible mode answers TPM overruns with 429
		// insufficient_quota; OpenAI uses the same code for an exhausted
		// billing quota, which no wait fixes.
		if status == http.StatusTooManyRequests && !strings.Contains(strings.ToLower(c.Message), "billing") {
			c.Kind = KindRateLimitTokens
		} else {
			c.Kind = KindClient
		}
	case known && kind.RateLimited() && (status == http.StatusTooManyRequests || status == 0 || status >= 500 || status == 400):
		c.Kind = kind
	case status == http.StatusTooManyRequests:
		c.Kind = KindRateLimit
	case status == http.StatusRequestTimeout:
		c.Kind = KindTransient
	case status >= 500:
		c.Kind = KindServer
	default:
		c.Kind = KindClient
	}
	if c.Kind == KindRateLimit { // refine an unspecific 429 by message and headers
		c.Kind = refineRateLimit(c.Message, info)
	}
	if c.Kind.RateLimited() && c.RetryAfter == 0 {
		switch c.Kind {
		case KindRateLimitRequests:
			c.RetryAfter = max(info.ResetRequests, 0)
		case KindRateLimitTokens:
			c.RetryAfter = max(info.ResetTokens, 0)
		}
	}
	return c
}

func refineRateLimit(msg string, info rateLimitInfo) Kind {
	m := strings.ToLower(msg)
	switch {
	case strings.Contains(m, "burst"):
		return KindRateLimitBurst
	case strings.Contains(m, "tokens per") || strings.Contains(m, "(tpm)") || strings.Contains(m, "(tps)"):
		return KindRateLimitTokens
	case strings.Contains(m, "requests per") || strings.Contains(m, "(rpm)") || strings.Contains(m, "(rps)"):
		return KindRateLimitRequests
	case info.RemainingTokens == 0:
		return KindRateLimitTokens
	case info.RemainingRequests == 0:
		return KindRateLimitRequests
	}
	return KindRateLimit
}

var secretRE = regexp.MustCompile(`(?i)(sk-[a-z0-9_\-*]{4,}|bearer\s+\S+)`)

// redact truncates a provider message and removes anything like a key.
func redact(s string) string {
	s = secretRE.ReplaceAllString(s, "[redacted]")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// ClassifyError diagnoses a transport error (no HTTP response).
func ClassifyError(err error) Classification {
	var c Classification
	var ne net.Error
	switch {
	case err == nil:
		c.Kind = KindOK
		return c
	case errors.Is(err, context.Canceled):
		c.Kind, c.Code = KindCanceled, "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		c.Kind, c.Code = KindTransient, "timeout"
	case errors.As(err, &ne) && ne.Timeout():
		c.Kind, c.Code = KindTransient, "timeout"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED), errors.Is(err, net.ErrClosed):
		c.Kind, c.Code = KindTransient, "connection"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		c.Kind, c.Code = KindTransient, "connection"
	default:
		var oe *net.OpError
		if errors.As(err, &oe) {
			c.Kind, c.Code = KindTransient, "connection"
		} else {
			// Unknown transport failures are retried; max_attempts bounds them.
			c.Kind, c.Code = KindTransient, "transport"
		}
	}
	c.Message = redact(err.Error())
	return c
}
