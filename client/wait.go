package client

import (
	"context"
	"errors"
	"fmt"
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

// Wait polls the job until it is terminal (succeeded, failed, dead or
// cancelled) and returns its status then: a job that failed is not an
// error of Wait; look at Status and Error. Passing failures of the API
// (retryable errors) are polled through; any other error ends the wait.
// When ctx ends first, Wait returns the last status it saw and ctx's
// error. Bound it with a context deadline.
func (c *Client) Wait(ctx context.Context, id string, opts WaitOptions) (JobStatus, error) {
	opts = opts.withDefaults()
	start := time.Now()
	delay := opts.Interval
	var last JobStatus
	for {
		st, err := c.poll(ctx, id)
		var ae *APIError
		switch {
		case err == nil:
			if last = st; st.Status.Terminal() {
				return st, nil
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

// poll is one look at the job. It is Wait's seam for long-polling: when
// the API gains GET /v1/jobs/{id}?wait=<duration> (answering at the job's
// next change), poll will ask for the time until its next poll and Wait
// stays as it is.
func (c *Client) poll(ctx context.Context, id string) (JobStatus, error) {
	return c.Get(ctx, id)
}
