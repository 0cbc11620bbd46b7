package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// WaitOptions tune Wait. The zero value is ready to use.
type WaitOptions struct {
	// Interval is the delay before the second poll (default 200ms); each
	// later delay is 1.5 times the one before, up to MaxInterval (default
	// 5s), and each is drawn from [d/2, d] so that many waiters spread out.
	Interval    time.Duration
	MaxInterval time.Duration
	// NotFoundGrace is how long a 404 counts as "not stored yet" and is
	// polled again. Set it for a job published to a queue, which the API
	// knows once llmq's ingester has stored it (within about a second).
	// Zero: a 404 ends the wait at once.
	NotFoundGrace time.Duration
}

func (o WaitOptions) withDefaults() WaitOptions {
	if o.Interval <= 0 {
		o.Interval = 200 * time.Millisecond
	}
	if o.MaxInterval <= 0 {
		o.MaxInterval = 5 * time.Second
	}
	o.MaxInterval = max(o.MaxInterval, o.Interval)
	return o
}

// longPollWait is how long one request of Wait asks the API to hold it
// (GET /v1/jobs/{id}?wait=), well under the default client's timeout.
const longPollWait = 30 * time.Second

// Wait waits until the job is terminal (succeeded, failed, dead or
// cancelled) and returns its status then: a job that failed is not an
// error of Wait; look at Status and Error. It long-polls: each request
// returns as soon as the job finishes, or after up to 30 s, and the next
// is sent at once; against an API that does not long-poll it polls with
// the backoff of opts. Passing failures of the API (retryable errors) are
// polled through; any other error ends the wait. When ctx ends first,
// Wait returns the last status it saw and ctx's error. Bound it with a
// context deadline.
func (c *Client) Wait(ctx context.Context, id string, opts WaitOptions) (JobStatus, error) {
	opts = opts.withDefaults()
	start := time.Now()
	delay := opts.Interval
	var last JobStatus
	for {
		st, longPolled, err := c.poll(ctx, id)
		var ae *APIError
		switch {
		case err == nil:
			if last = st; st.Status.Terminal() {
				return st, nil
			}
			if longPolled {
				delay = opts.Interval
				continue // the API held the request: ask again at once
			}
		case errors.As(err, &ae) && ae.Code == CodeNotFound && time.Since(start) < opts.NotFoundGrace:
		case IsRetryable(err) && ctx.Err() == nil:
		default:
			return last, err
		}
		t := time.NewTimer(jitter(delay))
		select {
		case <-ctx.Done():
			t.Stop()
			if last.Status == "" {
				return last, fmt.Errorf("llmq: wait for job %s: %w", id, context.Cause(ctx))
			}
			return last, fmt.Errorf("llmq: wait for job %s (last seen %s): %w", id, last.Status, context.Cause(ctx))
		case <-t.C:
		}
		delay = min(delay*3/2, opts.MaxInterval)
	}
}

// poll is one long-poll of the job, bounded by ctx's deadline and the
// HTTP client's timeout. longPolled reports whether the API held the
// request (it answered with X-Llmq-Waited).
func (c *Client) poll(ctx context.Context, id string) (st JobStatus, longPolled bool, err error) {
	wait := longPollWait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl))
	}
	if c.hc.Timeout > 0 {
		wait = min(wait, c.hc.Timeout*3/4)
	}
	path := "/v1/jobs/" + url.PathEscape(id)
	if wait >= time.Millisecond {
		path += "?wait=" + strconv.FormatInt(wait.Milliseconds(), 10) + "ms"
	}
	r, err := c.send(ctx, http.MethodGet, path, nil)
	if err == nil {
		err = r.err()
	}
	if err == nil {
		err = r.decode(&st)
	}
	if err != nil {
		return st, false, fmt.Errorf("llmq: get job %s: %w", id, err)
	}
	return st.normalized(), r.header.Get("X-Llmq-Waited") != "", nil
}
