package soak

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// submissions tracks the submissions still being tried and those given up.
type submissions struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	open    int
	refused map[string]int
}

func (s *submissions) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}

func (s *submissions) counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for k, v := range s.refused {
		out[k] = v
	}
	return out
}

// wait waits for the open submissions, at most d.
func (s *submissions) wait(d time.Duration) {
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(max(d, 0)):
	}
}

// submitLoad submits rate jobs a second, alternating HTTP and raw AMQP,
// until load ends. Each submission is tried again through outages under
// ctx (not load), so one started before the end still gets its answer.
func submitLoad(load, ctx context.Context, rate float64, h httpSubmitter, a *amqpSubmitter, l *Ledger, log *slog.Logger) *submissions {
	subs := &submissions{refused: map[string]int{}}
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-load.Done():
			return subs
		case <-tick.C:
		}
		id, via := jobID(i)
		body := jobBody(id, Model)
		send := func(c context.Context) error { return h.submit(c, body) }
		if via == "amqp" {
			send = func(c context.Context) error { return a.submit(c, id, body) }
		}
		subs.mu.Lock()
		subs.open++
		subs.mu.Unlock()
		subs.wg.Go(func() {
			attempts, err := submitUntil(ctx, send)
			subs.mu.Lock()
			subs.open--
			if err != nil {
				subs.refused[via]++
			}
			subs.mu.Unlock()
			if err != nil {
				log.Warn("soak: submission given up", "job_id", id, "via", via, "attempts", attempts, "err", err)
				return
			}
			l.Accept(id, via, time.Now())
			if attempts > 1 {
				log.Info("soak: submission accepted after retries", "job_id", id, "via", via, "attempts", attempts)
			}
		})
	}
}
