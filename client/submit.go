package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"
)

// Submit submits one job over HTTP and returns once llmq holds it
// durably. A job with no ID gets one (NewID) before the first attempt,
// so that a retry — by WithSubmitRetry or by the caller, with the ID the
// returned Submitted carries even on error — is processed once.
//
// Errors: a *BackpressureError when the backlog is full (429); an
// *APIError otherwise, naming the field of a 400, and carrying the job's
// ID on a 503 (the job was not taken; retry with that ID). IsRetryable
// tells which are worth retrying. Submitting a job the tenant already has
// is not an error: Submitted.Created is false.
func (c *Client) Submit(ctx context.Context, j Job) (Submitted, error) {
	if j.ID == "" {
		j.ID = NewID()
	}
	sub := Submitted{ID: j.ID}
	body, err := j.encode()
	if err == nil {
		var r response
		if r, err = c.submit(ctx, "/v1/jobs", body); err == nil {
			err = r.decode(&sub)
			sub.Created = r.status == http.StatusAccepted
		}
	}
	if err != nil {
		return Submitted{ID: j.ID}, fmt.Errorf("llmq: submit job %s: %w", j.ID, err)
	}
	return sub, nil
}

// BatchResult is the outcome of one job of SubmitBatch.
type BatchResult struct {
	// ID is the job's ID, generated when the job had none.
	ID string
	// Status is the job's status once accepted.
	Status Status
	// Created is false for a job the tenant already had.
	Created bool
	// Err is nil when the job was accepted, else why not: an *APIError
	// (Retryable says whether to submit it again), or the error of the
	// whole request.
	Err error
}

// SubmitBatch submits up to the API's batch limit (1000 by default) jobs in
// one request and returns one result per job, in order. Jobs with no ID
// get one first, as Submit does. Each job is accepted or refused on its
// own; err is non-nil only when the request as a whole failed (every
// result then carries it, with the ID to retry with): a
// *BackpressureError when no job was taken for back-pressure, a lost
// connection, a refused request (e.g. 413 for too many jobs), or a job
// whose Request or Metadata is not JSON (a *ValidationError; nothing was
// sent).
func (c *Client) SubmitBatch(ctx context.Context, jobs []Job) ([]BatchResult, error) {
	results := make([]BatchResult, len(jobs))
	items := make([]json.RawMessage, len(jobs))
	var err error
	for i, j := range jobs {
		if j.ID == "" {
			j.ID = NewID()
		}
		results[i].ID = j.ID
		if items[i], err = j.encode(); err != nil {
			err = fmt.Errorf("job %d: %w", i, err)
			break
		}
	}
	var r response
	if err == nil {
		body, _ := json.Marshal(items) // items are valid JSON
		r, err = c.submit(ctx, "/v1/jobs:batch", body)
	}
	var resp struct {
		Results []struct {
			HTTPStatus int    `json:"http_status"`
			ID         string `json:"id"`
			Status     Status `json:"status"`
			Error      *struct {
				Code, Field, Message string
			} `json:"error"`
		} `json:"results"`
	}
	if err == nil {
		if err = r.decode(&resp); err == nil && len(resp.Results) != len(jobs) {
			err = fmt.Errorf("the API answered %d results for %d jobs", len(resp.Results), len(jobs))
		}
	}
	if err != nil {
		err = fmt.Errorf("llmq: submit batch of %d jobs: %w", len(jobs), err)
		for i := range results {
			results[i].Err = err
		}
		return results, err
	}
	for i, it := range resp.Results {
		if it.Error != nil {
			results[i].Err = &APIError{StatusCode: it.HTTPStatus, Code: it.Error.Code, Field: it.Error.Field, Message: it.Error.Message, JobID: results[i].ID}
			continue
		}
		results[i].Status, results[i].Created = it.Status, it.HTTPStatus == http.StatusAccepted
	}
	return results, nil
}

// submit posts a submission and returns its 2xx answer, retrying as
// WithSubmitRetry allows.
func (c *Client) submit(ctx context.Context, path string, body []byte) (response, error) {
	var waited time.Duration
	for attempt := 0; ; attempt++ {
		r, err := c.send(ctx, http.MethodPost, path, body)
		if err == nil {
			err = r.err()
		}
		if err == nil || !IsRetryable(err) {
			return r, err
		}
		wait := retryDelay(err, attempt)
		if waited+wait > c.retryFor {
			return r, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return r, fmt.Errorf("%w (while waiting to retry after: %v)", context.Cause(ctx), err)
		case <-t.C:
		}
		waited += wait
	}
}

// retryDelay is how long to wait before attempt+1: the server's
// Retry-After when it gave one, else an exponential backoff from 100ms
// (doubling, capped at 5s) with jitter.
func retryDelay(err error, attempt int) time.Duration {
	var bp *BackpressureError
	if errors.As(err, &bp) && bp.RetryAfter > 0 {
		return bp.RetryAfter
	}
	var ae *APIError
	if errors.As(err, &ae) && ae.RetryAfter > 0 {
		return ae.RetryAfter
	}
	return jitter(min(100*time.Millisecond<<min(attempt, 6), 5*time.Second))
}

// jitter returns a duration drawn uniformly from [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
