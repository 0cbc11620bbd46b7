package bench

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/worker"
)

// jobMarker starts every bench job's prompt: "[bench-job:<id>] …", so the
// provider wrappers can tell which job a call belongs to.
const jobMarker = "[bench-job:"

func jobIDOf(request []byte) string {
	i := bytes.Index(request, []byte(jobMarker))
	if i < 0 {
		return ""
	}
	rest := request[i+len(jobMarker):]
	j := bytes.IndexByte(rest, ']')
	if j < 0 {
		return ""
	}
	return string(rest[:j])
}

// countingProvider records every call that reaches the provider, per job.
type countingProvider struct {
	next worker.Provider

	mu        sync.Mutex
	calls     int
	ok        map[string]int // successful calls per job
	seen      map[string]struct{}
	rejected  int // 429s
	otherErrs int
}

func newCountingProvider(next worker.Provider) *countingProvider {
	return &countingProvider{next: next, ok: map[string]int{}, seen: map[string]struct{}{}}
}

func (p *countingProvider) Chat(ctx context.Context, model string, request []byte) (*provider.Response, error) {
	resp, err := p.next.Chat(ctx, model, request)
	id := jobIDOf(request)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	p.seen[id] = struct{}{}
	var perr *provider.Error
	switch {
	case err == nil:
		p.ok[id]++
	case errors.As(err, &perr) && perr.Class.Kind.RateLimited():
		p.rejected++
	default:
		p.otherErrs++
	}
	return resp, err
}

// duplicates counts jobs with more than one successful call.
func (p *countingProvider) duplicates() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.ok {
		if c > 1 {
			n++
		}
	}
	return n
}

// basicRetryProvider is the guide's "basic retry" client in its native
// implementation (docs/design.md#strategies): on a 429, a 5xx or a connection error it sleeps
// min(60 s, 1 s·2^(attempt−1)) + uniform(0, 1 s) and tries again, at most
// 5 retries, holding its worker meanwhile. Other errors return at once.
type basicRetryProvider struct {
	next       worker.Provider
	maxRetries int
	base, max  time.Duration
	rnd        func() float64
}

func newBasicRetryProvider(next worker.Provider) *basicRetryProvider {
	return &basicRetryProvider{next: next, maxRetries: 5, base: time.Second, max: time.Minute, rnd: rand.Float64}
}

func (p *basicRetryProvider) Chat(ctx context.Context, model string, request []byte) (*provider.Response, error) {
	for attempt := 0; ; {
		resp, err := p.next.Chat(ctx, model, request)
		if err == nil || !basicRetryable(err) {
			return resp, err
		}
		attempt++
		wait, ok := p.backoff(attempt)
		if !ok {
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
	}
}

// backoff is the sleep before retry number attempt (from 1), and false
// once the retries are spent.
func (p *basicRetryProvider) backoff(attempt int) (time.Duration, bool) {
	if attempt > p.maxRetries {
		return 0, false
	}
	return min(p.max, p.base<<(attempt-1)) + time.Duration(p.rnd()*float64(time.Second)), true
}

// basicRetryable is the guide's RETRYABLE_ERRORS: RateLimitError,
// InternalServerError (5xx) and APIConnectionError.
func basicRetryable(err error) bool {
	var perr *provider.Error
	if !errors.As(err, &perr) {
		return ratecontrol.ClassifyError(err).Kind.Retryable()
	}
	return perr.Class.Kind.Retryable()
}

// jobsCalled counts the jobs that reached the provider at least once.
func (p *countingProvider) jobsCalled() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}
