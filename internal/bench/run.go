package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/worker"
)

// Env is what a run needs from its surroundings.
type Env struct {
	// PostgresURL points at a server where a fresh database is created for
	// each run (and dropped after it).
	PostgresURL string
	// Logger receives the worker's log (nil: discarded).
	Logger *slog.Logger
	// Seed makes fault injection reproducible.
	Seed uint64
	// Broker is what jobs go through: BrokerMemory (the default),
	// BrokerRabbitMQ or BrokerKafka. On a real broker half the jobs are
	// published raw onto the intake and half submitted over the producer
	// API, so the intake paths are in the measurement.
	Broker string
	// AMQPURL is the RabbitMQ of BrokerRabbitMQ; each run gets a vhost of
	// its own there.
	AMQPURL string
	// KafkaBrokers are the Kafka of BrokerKafka; empty starts an in-process
	// kfake cluster per run.
	KafkaBrokers []string
}

func (e Env) broker() string {
	if e.Broker == "" {
		return BrokerMemory
	}
	return e.Broker
}

// Run runs one strategy through one scenario, end to end.
func Run(ctx context.Context, env Env, sc Scenario, strategy ratecontrol.Strategy) (*RunResult, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	if !slices.Contains(Brokers, env.broker()) {
		return nil, fmt.Errorf("unknown broker %q (want one of %s)", env.broker(), strings.Join(Brokers, ", "))
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("scenario", sc.Name, "strategy", string(strategy))

	pool, drop, err := FreshDatabase(ctx, env.PostgresURL)
	if err != nil {
		return nil, err
	}
	defer drop()
	st := &notifyStore{Store: store.New(pool), want: int64(sc.jobs()), done: make(chan struct{})}

	simulator, err := sim.New(sim.Config{
		APIKeys: []string{benchKey},
		Headers: sim.HeaderConfig{RetryAfter: true, RateLimit: true},
		Faults:  sim.FaultConfig{Seed: env.Seed + 1, ErrorRate: sc.ErrorRate},
		Models:  map[string]sim.ModelConfig{Model: sc.simModel()},
	})
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", sc.Name, err)
	}
	srv := httptest.NewServer(simulator)
	defer func() { simulator.Close(); srv.Close() }()

	pcfg := provider.Config{BaseURL: srv.URL + "/v1", APIKey: config.Secret(benchKey),
		Timeout: 60 * time.Second, MaxConns: sc.Concurrency + 16}
	if strategy == ratecontrol.StrategyAuto {
		pcfg.WaitTimeout = sc.ServerQueue
	}
	client, err := provider.New(pcfg)
	if err != nil {
		return nil, fmt.Errorf("provider client: %w", err)
	}
	defer client.Close()
	counting := newCountingProvider(client)
	var prov worker.Provider = counting
	maxAttempts := 6 // the guide's 1 + 5 retries, as durable retries
	if strategy == ratecontrol.StrategyRetry {
		prov = newBasicRetryProvider(counting) // retries inside the call, as the guide's client does
		maxAttempts = 1
	}

	models := map[string]config.Model{Model: {
		RPM: float64(sc.RPM), TPM: float64(sc.TPM), RPS: float64(sc.RPS), TPS: float64(sc.TPS),
		MaxConcurrency: sc.Concurrency, Strategy: string(strategy), Warmup: sc.Warmup,
	}}
	wcfg := worker.Config{
		Owner: "bench-" + string(strategy), Lease: 2 * time.Minute, Prefetch: 256,
		RetryBase: time.Second, RetryMax: time.Minute, ShutdownGrace: 2 * time.Second, Models: models,
	}
	if strategy == ratecontrol.StrategyRetry {
		// N workers: at most N jobs held, each sleeping out its own backoff.
		wcfg.MaxInFlight, wcfg.Prefetch = sc.Concurrency, sc.Concurrency
	}
	rb, err := openBroker(ctx, env, log)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	defer rb.close()
	via := []submitFunc{rawSubmit(rb.raw)}
	var papi *producerAPI
	if rb.apiPub != nil {
		if papi, err = startProducerAPI(ctx, st.Store, rb, models, log); err != nil {
			return nil, err
		}
		defer papi.close()
		via = append(via, papi.submit)
	}
	// Jobs enter as in service: published to the intake (or submitted over
	// the API, which stores them first), stored and forwarded to the lane
	// by the ingester.
	w, ing, govs, err := pipeline(st, rb, prov, wcfg, models, strategy, log)
	if err != nil {
		return nil, err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	var wg sync.WaitGroup
	workerErr := make(chan error, 1)
	wg.Add(1)
	go func() { defer wg.Done(); workerErr <- w.Run(runCtx) }()
	wg.Go(func() { _ = ing.Run(runCtx) })

	published := newPublishLog()
	pubErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		pubErr <- publishPhases(runCtx, via, sc, start, maxAttempts, published)
	}()
	if log.Enabled(ctx, slog.LevelDebug) {
		wg.Add(1)
		go func() { defer wg.Done(); logGovernor(runCtx, log, govs) }()
	}
	if c := sc.Change; c != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleepUntil(runCtx, start.Add(c.At)) {
				return
			}
			m := sc.simModel()
			m.RPM, m.TPM, m.RPS, m.TPS = c.RPM, c.TPM, c.RPS, c.TPS
			if err := simulator.SetModel(Model, m); err != nil {
				log.Error("change limits", "error", err)
			}
		}()
	}
	var allDone <-chan struct{}
	if sc.StopWhenDone {
		allDone = st.done
	}
	end := time.NewTimer(time.Until(start.Add(sc.Duration)))
	select {
	case <-end.C:
	case <-allDone:
	case <-ctx.Done():
	}
	end.Stop()
	stats := simulator.Stats().Models[Model]
	stop()
	wg.Wait()
	if err := <-pubErr; err != nil && !errors.Is(err, context.Canceled) {
		return nil, fmt.Errorf("publish jobs: %w", err)
	}
	if err := <-workerErr; err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("run %s/%s: %w", sc.Name, strategy, err)
	}

	rows, err := jobRows(ctx, pool)
	if err != nil {
		return nil, err
	}
	res := summarize(sc, strategy, start, stats, rows, published.snapshot())
	res.Broker = rb.name
	if papi != nil {
		res.ViaHTTP, res.HTTPRetries = int(papi.accepted.Load()), int(papi.retried.Load())
	}
	res.DuplicateSuccesses = counting.duplicates()
	res.JobsCalled = counting.jobsCalled()
	return res, nil
}

const benchKey = "sk-llmq-bench"

// notifyStore is the real store that closes done once want jobs reached a
// terminal state, so a run can end when its work is done.
type notifyStore struct {
	*store.Store
	want     int64
	terminal atomic.Int64
	done     chan struct{}
}

func (s *notifyStore) add(n int) {
	if n > 0 && s.terminal.Add(int64(n)) == s.want {
		close(s.done)
	}
}

func (s *notifyStore) CompleteBatch(ctx context.Context, items []store.Completion) ([]bool, error) {
	ok, err := s.Store.CompleteBatch(ctx, items)
	n := 0
	for _, b := range ok {
		if b {
			n++
		}
	}
	s.add(n)
	return ok, err
}

func (s *notifyStore) Fail(ctx context.Context, a store.Attempt, e store.AttemptError) (bool, error) {
	ok, err := s.Store.Fail(ctx, a, e)
	if ok {
		s.add(1)
	}
	return ok, err
}

func (s *notifyStore) MarkDeadLettered(ctx context.Context, a store.Attempt, e store.AttemptError, dl store.DeadLetterRow) (bool, error) {
	ok, err := s.Store.MarkDeadLettered(ctx, a, e, dl)
	if ok {
		s.add(1)
	}
	return ok, err
}

// RecordDeadLetter counts a job the claim found exhausted (the claim moved
// it to dead; its dead letter follows).
func (s *notifyStore) RecordDeadLetter(ctx context.Context, dl store.DeadLetterRow) (int64, error) {
	id, err := s.Store.RecordDeadLetter(ctx, dl)
	if err == nil && dl.Kind != store.DeadLetterMessage {
		s.add(1)
	}
	return id, err
}

func sleepUntil(ctx context.Context, at time.Time) bool {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// jobRow is what the report needs of a job row.
type jobRow struct {
	ID          string
	Status      job.Status
	Attempts    int
	CompletedAt *time.Time
}

func jobRows(ctx context.Context, pool *pgxpool.Pool) ([]jobRow, error) {
	rows, err := pool.Query(ctx, `SELECT id, status, attempts, completed_at FROM jobs`)
	if err != nil {
		return nil, fmt.Errorf("read job rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (jobRow, error) {
		var j jobRow
		var status string
		err := r.Scan(&j.ID, &status, &j.Attempts, &j.CompletedAt)
		j.Status = job.Status(status)
		return j, err
	})
	if err != nil {
		return nil, fmt.Errorf("read job rows: %w", err)
	}
	return out, nil
}

// logGovernor logs the model's governor state every 5 s (debug).
func logGovernor(ctx context.Context, log *slog.Logger, govs <-chan *ratecontrol.Governor) {
	var g *ratecontrol.Governor
	select {
	case g = <-govs:
	case <-ctx.Done():
		return
	}
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
		s := g.Snapshot()
		attrs := []any{"concurrency_limit", s.ConcurrencyLimit, "in_flight", s.InFlight, "waiting", s.Waiting,
			"levels", s.Levels, "pacer_interval", s.PacerInterval, "in_flight_tokens", s.InFlightTokens,
			"output_mean", s.Calibration.OutputMean, "output_dev", s.Calibration.OutputDev, "input_ratio", s.Calibration.InputRatio,
			"granted", s.Granted, "rate_limited", s.RateLimited, "token_margin", s.TokenMargin}
		if c := s.Controller; c != nil {
			attrs = append(attrs, "state", c.State.String(), "ctl_limit", c.Limit, "ceiling", c.Ceiling, "cuts", c.Cuts)
		}
		log.Debug("governor", attrs...)
	}
}

// pipeline builds a run's worker over rb with the strategy's governors
// (each sent on the returned channel while it has room, for logGovernor)
// and the ingester that stores intake messages in st and forwards them to
// the lanes, as in service.
func pipeline(st *notifyStore, rb *runBroker, prov worker.Provider, wcfg worker.Config, models map[string]config.Model,
	strategy ratecontrol.Strategy, log *slog.Logger) (*worker.Worker, *ingest.Ingester, <-chan *ratecontrol.Governor, error) {
	factory := worker.GovernorFactory(models, string(strategy), ratecontrol.WithLogger(log))
	govs := make(chan *ratecontrol.Governor, 4)
	w, err := worker.New(wcfg, worker.Deps{Store: st, Subscriber: rb.sub, Provider: prov,
		Governor: func(m string) *ratecontrol.Governor {
			g := factory(m)
			select {
			case govs <- g:
			default:
			}
			return g
		}, Logger: log})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("worker: %w", err)
	}
	ing, err := ingest.New(ingest.Config{}, ingest.Deps{Store: st, Intake: rb.intake, Lanes: rb.lanes, Logger: log})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("ingester: %w", err)
	}
	return w, ing, govs, nil
}
