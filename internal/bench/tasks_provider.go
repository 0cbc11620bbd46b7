package bench

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/worker"
)

// taskProvider is the provider client of the tasks scenario: it records
// when each job's task was accepted and, for the naive retry client, sleeps
// out a refused submission as the guide's basic retry does
// (basicRetryProvider) while its worker waits.
type taskProvider struct {
	next  *provider.Client
	retry *basicRetryProvider // nil: no retry inside the call

	mu sync.Mutex
	at map[string]time.Time // job id → accepted submission
}

var _ worker.TaskRunner = (*taskProvider)(nil)

func newTaskProvider(next *provider.Client, retry bool) *taskProvider {
	p := &taskProvider{next: next, at: map[string]time.Time{}}
	if retry {
		p.retry = &basicRetryProvider{maxRetries: 5, base: time.Second, max: time.Minute, rnd: rand.Float64}
	}
	return p
}

func (p *taskProvider) Chat(ctx context.Context, model string, request []byte) (*provider.Response, error) {
	return p.next.Chat(ctx, model, request)
}

func (p *taskProvider) SubmitTask(ctx context.Context, model, endpoint string, request []byte) (string, error) {
	for attempt := 0; ; {
		id, err := p.next.SubmitTask(ctx, model, endpoint, request)
		if err == nil {
			p.mu.Lock()
			p.at[jobIDOf(request)] = time.Now()
			p.mu.Unlock()
			return id, nil
		}
		if p.retry == nil || !basicRetryable(err) {
			return "", err
		}
		attempt++
		wait, ok := p.retry.backoff(attempt)
		if !ok {
			return "", err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", err
		}
	}
}

func (p *taskProvider) PollTask(ctx context.Context, model, id string) (string, *provider.Response, error) {
	return p.next.PollTask(ctx, model, id)
}

// accepted returns when each job's task was accepted.
func (p *taskProvider) accepted() map[string]time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]time.Time, len(p.at))
	for k, v := range p.at {
		out[k] = v
	}
	return out
}
