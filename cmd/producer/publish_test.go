package main

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/client"
)

// flaky fails its first publishes with the errors it holds.
type flaky struct {
	errs  []error
	calls int
}

func (f *flaky) Publish(ctx context.Context, j client.Job) error {
	f.calls++
	if len(f.errs) == 0 {
		return nil
	}
	err := f.errs[0]
	f.errs = f.errs[1:]
	return err
}

func (f *flaky) Close() error { return nil }

// A line whose publish fails for a passing reason is published again with
// backoff; one the broker will never take fails at once, and one that keeps
// failing gives up after publishTimeout with the last reason.
func TestPublishRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		passing := &client.PublishError{JobID: "a", To: "topic llmq.jobs.normal", Err: client.ErrRejected}
		j := client.Job{ID: "a"}

		f := &flaky{errs: []error{passing, passing}}
		start := time.Now()
		require.NoError(t, publish(t.Context(), f, j))
		assert.Equal(t, 3, f.calls)
		assert.Equal(t, 300*time.Millisecond, time.Since(start), "100ms, then 200ms")

		never := &client.PublishError{JobID: "a", To: "topic llmq.jobs.normal", Err: client.ErrUnroutable}
		f = &flaky{errs: []error{never}}
		require.ErrorIs(t, publish(t.Context(), f, j), client.ErrUnroutable)
		assert.Equal(t, 1, f.calls)

		f = &flaky{errs: make([]error, 100)}
		for i := range f.errs {
			f.errs[i] = passing
		}
		start = time.Now()
		err := publish(t.Context(), f, j)
		assert.True(t, errors.Is(err, client.ErrRejected), "%v", err)
		assert.Equal(t, publishTimeout, time.Since(start))
	})
}
