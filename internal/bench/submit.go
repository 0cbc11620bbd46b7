package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
)

// submitFunc puts one job message into llmq.
type submitFunc func(ctx context.Context, id string, body []byte) error

// rawSubmit publishes the job message as it is onto the intake (RabbitMQ
// exchange llmq.jobs, Kafka topic llmq.jobs.normal), as any producer does
// (docs/design.md#job-message).
func rawSubmit(pub broker.Publisher) submitFunc {
	return func(ctx context.Context, id string, body []byte) error {
		return pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: body})
	}
}

// producerAPI is the producer HTTP API (internal/api) served over loopback
// against the run's store and broker, keyless: its jobs belong to tenant
// default, as raw messages without a tenant do.
type producerAPI struct {
	srv  *api.Server
	http *httptest.Server
	stop context.CancelFunc
	done sync.WaitGroup

	// accepted counts the jobs the API answered 202, retried the answers
	// asking to try again (503, 429).
	accepted, retried atomic.Int64
}

func startProducerAPI(ctx context.Context, st api.Store, b *runBroker, models map[string]config.Model, log *slog.Logger) (*producerAPI, error) {
	srv, err := api.New(api.Config{Store: st, Publisher: b.apiPub, Inspector: b.apiInsp, Models: models, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("producer API: %w", err)
	}
	p := &producerAPI{srv: srv, http: httptest.NewServer(srv.Handler())}
	runCtx, stop := context.WithCancel(ctx)
	p.stop = stop
	p.done.Go(func() { srv.Run(runCtx) })
	return p, nil
}

func (p *producerAPI) close() {
	p.http.Close()
	p.stop()
	p.done.Wait()
	p.srv.Close()
}

// submit is POST /v1/jobs with the job message, as a careful producer
// sends it: a 503 (the broker did not confirm in time; nothing was stored)
// or a 429 is tried again with the same id after Retry-After or
// submitRetryWait; anything else but 202 is an error, since every job is
// new.
func (p *producerAPI) submit(ctx context.Context, id string, body []byte) error {
	for {
		code, retryAfter, err := p.post(ctx, body)
		if err != nil {
			return err
		}
		if code == http.StatusAccepted {
			p.accepted.Add(1)
			return nil
		}
		p.retried.Add(1)
		if retryAfter <= 0 {
			retryAfter = submitRetryWait
		}
		if !sleepUntil(ctx, time.Now().Add(retryAfter)) {
			return ctx.Err()
		}
	}
}

// submitRetryWait is the wait before a submission the API asked to retry
// without a Retry-After.
const submitRetryWait = 500 * time.Millisecond

// post sends one POST /v1/jobs; it returns 202, or 503 and 429 with their
// Retry-After, and an error for any other answer.
func (p *producerAPI) post(ctx context.Context, body []byte) (int, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.http.URL+"/v1/jobs", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.http.Client().Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	switch resp.StatusCode {
	case http.StatusAccepted:
		return resp.StatusCode, 0, nil
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return resp.StatusCode, time.Duration(secs) * time.Second, nil
	}
	return 0, 0, fmt.Errorf("POST /v1/jobs: %s: %s", resp.Status, bytes.TrimSpace(msg))
}

// submitters is how many jobs are being submitted at once: a producer
// fleet, not one client in a loop, so the API's group commit and the
// broker's confirms see concurrent traffic.
const submitters = 8

// publishPhases submits each phase's jobs when the phase starts, job n
// through via[n % len(via)], and notes when each was handed over.
func publishPhases(ctx context.Context, via []submitFunc, sc Scenario, start time.Time, maxAttempts int, log *publishLog) error {
	n := 0
	for pi, ph := range sc.Phases {
		if !sleepUntil(ctx, start.Add(ph.At)) {
			return ctx.Err()
		}
		next := make(chan int)
		errs := make(chan error, submitters)
		var wg sync.WaitGroup
		for range submitters {
			wg.Go(func() {
				for k := range next {
					id := fmt.Sprintf("p%d-%06d", pi, k)
					log.add(id, time.Now())
					if err := via[k%len(via)](ctx, id, jobBody(id, sc, maxAttempts)); err != nil {
						errs <- fmt.Errorf("submit %s: %w", id, err)
						return
					}
				}
			})
		}
		var err error
	feed:
		for k := n; k < n+ph.Jobs; k++ {
			select {
			case next <- k:
			case err = <-errs:
				break feed
			}
		}
		close(next)
		wg.Wait()
		if err == nil {
			select {
			case err = <-errs:
			default:
			}
		}
		if err != nil {
			return err
		}
		n += ph.Jobs
	}
	return nil
}
