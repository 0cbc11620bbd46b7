package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// openAIError is the OpenAI error object.
type openAIError struct {
	Error openAIErrorBody `json:"error"`
}

type openAIErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// dashScopeError is DashScope's native error body.
type dashScopeError struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	RequestID string `json:"request_id"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// writeError answers with an OpenAI error object.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	writeJSON(w, status, openAIError{Error: openAIErrorBody{Message: msg, Type: typ, Code: code}})
}

// Codes of 429 bodies per reason.
func openAICode(r Reason) string {
	switch r {
	case ReasonTPM, ReasonTPS, ReasonAudioSeconds:
		return "insufficient_quota"
	case ReasonBurst:
		return "limit_burst_rate"
	}
	return "limit_requests"
}

func dashScopeCode(r Reason) string {
	switch r {
	case ReasonTPM, ReasonTPS, ReasonAudioSeconds:
		return "Throttling.AllocationQuota"
	case ReasonBurst:
		return "Throttling.BurstRate"
	}
	return "Throttling.RateQuota"
}

func limitMessage(model string, d decision) string {
	switch d.reason {
	case ReasonRPM:
		return fmt.Sprintf("Requests rate limit exceeded for model %s: rpm limit %d per 60s, please try again later.", model, d.limit)
	case ReasonRPS:
		return fmt.Sprintf("Requests rate limit exceeded for model %s: rps limit %d per 1s, please try again later.", model, d.limit)
	case ReasonTPM:
		return fmt.Sprintf("Token usage exceeded for model %s: tpm limit %d per 60s, please try again later.", model, d.limit)
	case ReasonTPS:
		return fmt.Sprintf("Token usage exceeded for model %s: tps limit %d per 1s, please try again later.", model, d.limit)
	case ReasonAudioSeconds:
		return fmt.Sprintf("Audio duration exceeded for model %s: audio seconds limit %d per 60s, please try again later.", model, d.limit)
	}
	return fmt.Sprintf("Request rate increased too quickly for model %s (burst threshold %d requests/s), please ramp up gradually or set X-DashScope-Wait-Timeout.", model, d.limit)
}

// writeRateLimited answers a refused request with a 429 in the simulator's dialect.
func (s *Simulator) writeRateLimited(w http.ResponseWriter, model, requestID string, d decision) {
	if s.cfg.Headers.RetryAfter {
		secs := max(1, int64((d.wait+time.Second-1)/time.Second))
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		w.Header().Set("retry-after-ms", strconv.FormatInt(max(1, d.wait.Milliseconds()), 10))
	}
	msg := limitMessage(model, d)
	if s.cfg.Dialect == DialectDashScope {
		writeJSON(w, http.StatusTooManyRequests, dashScopeError{Code: dashScopeCode(d.reason), Message: msg, RequestID: requestID})
		return
	}
	code := openAICode(d.reason)
	writeError(w, http.StatusTooManyRequests, code, code, msg)
}
