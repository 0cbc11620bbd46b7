package client

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// IsRetryable reports whether the operation that returned err may succeed
// if tried again later with the same job ID. It is true for a 5xx, for
// back-pressure (429, or a queue that refused the message), for a lost
// connection and for a publish whose outcome is unknown; false for a 4xx
// (the request itself is wrong), for an invalid job, for a closed
// publisher, and when the caller's context ended. Retrying with the same
// ID is always safe: a job ID is processed once.
//
// Every error of this package that can be retried says so through a
// Retryable() bool method; IsRetryable finds it in err's chain.
func IsRetryable(err error) bool {
	var r interface{ Retryable() bool }
	return errors.As(err, &r) && r.Retryable()
}

// Error codes of the API (APIError.Code).
const (
	CodeUnauthorized      = "unauthorized"
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

// APIError is an error response of the API (any status but 429, which is
// a *BackpressureError), or the refusal of one item of a batch.
type APIError struct {
	StatusCode int
	// Code is one of the Code* constants, or "http_<status>" for an
	// answer that is not the API's own (a proxy's).
	Code string
	// Field names the offending field of a 400, e.g. "request.messages" or
	// "fallback_models[1]".
	Field   string
	Message string
	// JobID is the job's ID on a 503 of a submission (the job was not
	// taken, or may not have been: a retry with this ID is processed once)
	// and on a refused job of a batch.
	JobID string
	// RetryAfter is the server's Retry-After, when it sent one.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.StatusCode, e.Code, e.Message)
}

// Retryable reports whether the request may succeed later unchanged: a 5xx
// or a 429. Any other 4xx will fail again.
func (e *APIError) Retryable() bool {
	return e.StatusCode >= 500 || e.StatusCode == 429
}

// BackpressureError is a 429: llmq's backlog is over its hard limit and
// the job was not taken. Try again after RetryAfter (Submit does when the
// client has WithSubmitRetry).
type BackpressureError struct {
	// RetryAfter is the server's estimate of when the backlog will have
	// room (its Retry-After header).
	RetryAfter time.Duration
	// Backlog is the number of jobs waiting or running.
	Backlog int64
}

func (e *BackpressureError) Error() string {
	return fmt.Sprintf("429 backpressure: the backlog (%d jobs) is over its hard limit; retry after %s", e.Backlog, e.RetryAfter)
}

// Retryable is always true.
func (e *BackpressureError) Retryable() bool { return true }

// ValidationError names the field of a job that a publisher refused before
// publishing it, and the rule it breaks.
type ValidationError struct {
	Field string
	Rule  string
}

func (e *ValidationError) Error() string { return fmt.Sprintf("invalid job: %s: %s", e.Field, e.Rule) }

// Retryable is always false: the job must change first.
func (e *ValidationError) Retryable() bool { return false }

func invalid(field, rule string) *ValidationError { return &ValidationError{Field: field, Rule: rule} }

// Errors a publisher returns inside a *PublishError.
var (
	// ErrClosed: the publisher was closed, or the channel it was given is.
	ErrClosed = errors.New("publisher closed")
	// ErrRejected: the broker refused the message (RabbitMQ nack, e.g. an
	// intake queue at its length limit): back-pressure, worth retrying.
	ErrRejected = errors.New("the broker refused the message")
	// ErrUnroutable: RabbitMQ has no llmq intake to route the message to
	// (exchange llmq.jobs, or its queue for the priority, is missing): llmq
	// is not deployed on this vhost, or not yet started.
	ErrUnroutable = errors.New("no llmq intake queue for the message")
)

// PublishError is a job a publisher could not publish, or whose publish
// the broker did not confirm.
type PublishError struct {
	JobID string
	// To is where it went: "exchange llmq.jobs, routing key high" or
	// "topic llmq.jobs.high".
	To  string
	Err error
}

func (e *PublishError) Error() string {
	return fmt.Sprintf("publish job %s to %s: %v", e.JobID, e.To, e.Err)
}

func (e *PublishError) Unwrap() error { return e.Err }

// Retryable reports whether publishing the job again may succeed: true
// unless the publisher is closed, llmq has no intake there, or the
// caller's context ended. When the outcome was unknown (no confirm before
// the connection dropped), the broker may hold the job already: publishing
// it again is safe, the ingester stores a job ID once.
func (e *PublishError) Retryable() bool {
	return !errors.Is(e.Err, ErrClosed) && !errors.Is(e.Err, ErrUnroutable) && !isContextErr(e.Err)
}

// transportError is a request that got no response: the connection failed
// or timed out. The request may or may not have reached the API.
type transportError struct{ err error }

func (e *transportError) Error() string   { return e.err.Error() }
func (e *transportError) Unwrap() error   { return e.err }
func (e *transportError) Retryable() bool { return true }

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
