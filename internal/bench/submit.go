package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
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
	// accepted counts the jobs the API answered 202.
	accepted atomic.Int64
	srv      *api.Server
	http     *httptest.Server
	stop     context.CancelFunc
	done     sync.WaitGroup
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

// submit is POST /v1/jobs with the job message; anything but 202 is an
// error, since every job is new.
func (p *producerAPI) submit(ctx context.Context, id string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.http.URL+"/v1/jobs", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.http.Client().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("POST /v1/jobs: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	p.accepted.Add(1)
	return nil
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
