package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/llmq/llmq/internal/job"
)

// Stable error codes of the API.
const (
	CodeUnauthorized = "unauthorized"
	// CodeForbidden answers a key that may not do what it asked: a tenant
	// key on /metrics or naming another tenant in ?tenant= (roles.go).
	CodeForbidden         = "forbidden"
	CodeInvalidJob        = "invalid_job"
	CodeInvalidRequest    = "invalid_request"
	CodeNotFound          = "not_found"
	CodeConflict          = "conflict"
	CodePayloadTooLarge   = "payload_too_large"
	CodeBackpressure      = "backpressure"
	CodeBrokerUnavailable = "broker_unavailable"
	CodeStoreUnavailable  = "store_unavailable"
	CodeInternal          = "internal"
)

// ErrorBody is the "error" member of every error response.
type ErrorBody struct {
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// errorResponse is an API error with its HTTP status.
type errorResponse struct {
	Status     int
	Body       ErrorBody
	RetryAfter int   // seconds; set on 429 and some 503s
	Backlog    int64 // set on backpressure
	// ID is the job's id on a 503 of a submission, so that a client whose
	// job got a generated id retries with it and is never charged twice.
	ID string
}

func (e *errorResponse) Error() string { return e.Body.Code + ": " + e.Body.Message }

func apiError(status int, code, message string) *errorResponse {
	return &errorResponse{Status: status, Body: ErrorBody{Code: code, Message: message}}
}

// validationError turns a *job.ValidationError into a 400 naming the field.
// badQuery is the 400 of a query parameter (field) the request got wrong.
func badQuery(field, message string) *errorResponse {
	return &errorResponse{Status: http.StatusBadRequest, Body: ErrorBody{Code: CodeInvalidRequest, Field: field, Message: message}}
}

func validationError(err error) *errorResponse {
	var v *job.ValidationError
	if errors.As(err, &v) {
		return &errorResponse{Status: http.StatusBadRequest, Body: ErrorBody{Code: CodeInvalidJob, Field: v.Field, Message: v.Error()}}
	}
	return apiError(http.StatusBadRequest, CodeInvalidJob, err.Error())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, e *errorResponse) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	body := struct {
		Error   ErrorBody `json:"error"`
		ID      string    `json:"id,omitempty"`
		Backlog *int64    `json:"backlog,omitempty"`
	}{Error: e.Body, ID: e.ID}
	if e.Body.Code == CodeBackpressure {
		body.Backlog = &e.Backlog
	}
	writeJSON(w, e.Status, body)
}
