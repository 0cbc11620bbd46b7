// Package launch assembles llmq's processes from a config.Config: the
// producer API and the consumer, with their Postgres pool, broker clients,
// metrics and health endpoints. cmd/producer, cmd/consumer and `llmq up`
// share it, so a process started alone and one started inside `llmq up` are
// built the same way.
package launch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/quota"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/worker"
)

// Options are what a caller may add to a process besides its config.
type Options struct {
	Logger *slog.Logger
	// Ready, when set, hears the address the process listens on once it
	// serves (the API address, or the consumer's metrics address).
	Ready func(addr string)
	// ProviderTransport replaces the provider client's HTTP transport (an
	// in-process simulator); nil uses the network.
	ProviderTransport http.RoundTripper
	// Failpoint is handed to the worker (TEST-ONLY crash points, see
	// worker.ParseFailpoint); nil in production.
	Failpoint func(name string)
}

func (o Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

// Pool opens a pgx pool with at least minConns connections (unless the URL
// sets pool_max_conns) and migrates the database.
func Pool(ctx context.Context, url string, minConns int32) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, errors.New("config: postgres_url (LLMQ_POSTGRES_URL) is required")
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errors.New("config: postgres_url: cannot be parsed") // the URL may hold a password
	}
	if !strings.Contains(url, "pool_max_conns") {
		pcfg.MaxConns = max(pcfg.MaxConns, minConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect postgres: %w", err)
	}
	if err := store.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// Publisher connects a publisher and an inspector to the configured broker.
func Publisher(ctx context.Context, cfg config.Config, log *slog.Logger) (broker.Publisher, broker.Inspector, error) {
	switch cfg.Broker {
	case "kafka":
		kc := kafka.Config{Brokers: cfg.KafkaBrokers, Logger: log}
		pub, err := kafka.NewPublisher(ctx, kc)
		if err != nil {
			return nil, nil, err
		}
		insp, err := kafka.NewInspector(ctx, kc)
		if err != nil {
			_ = pub.Close()
			return nil, nil, err
		}
		return pub, insp, nil
	default:
		rc := rabbitConfig(cfg, log)
		pub, err := rabbitmq.NewPublisher(ctx, rc)
		if err != nil {
			return nil, nil, err
		}
		insp, err := rabbitmq.NewInspector(ctx, rc)
		if err != nil {
			_ = pub.Close()
			return nil, nil, err
		}
		return pub, insp, nil
	}
}

// Subscriber connects a subscriber and an inspector (the readiness probe)
// to the configured broker.
func Subscriber(ctx context.Context, cfg config.Config, log *slog.Logger) (broker.Subscriber, broker.Inspector, error) {
	var (
		sub  broker.Subscriber
		insp broker.Inspector
		err  error
	)
	switch cfg.Broker {
	case "kafka":
		kc := kafka.Config{Brokers: cfg.KafkaBrokers, Logger: log}
		if sub, err = kafka.NewSubscriber(ctx, kc); err != nil {
			return nil, nil, err
		}
		if insp, err = kafka.NewInspector(ctx, kc); err != nil {
			sub.Close()
			return nil, nil, err
		}
	default:
		rc := rabbitConfig(cfg, log)
		if sub, err = rabbitmq.NewSubscriber(ctx, rc); err != nil {
			return nil, nil, err
		}
		if insp, err = rabbitmq.NewInspector(ctx, rc); err != nil {
			sub.Close()
			return nil, nil, err
		}
	}
	return sub, insp, nil
}

func rabbitConfig(cfg config.Config, log *slog.Logger) rabbitmq.Config {
	return rabbitmq.Config{URL: cfg.AMQPURL.Reveal(), MaxLength: int(cfg.Backpressure.LaneMaxLength), Logger: log}
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveHTTP serves h on addr until ctx ends, then shuts down gracefully.
func serveHTTP(ctx context.Context, addr string, h http.Handler, log *slog.Logger, ready func(string)) (wait func() error, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr().String())
	}
	return func() error {
		select {
		case <-ctx.Done():
		case err := <-done:
			if !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", addr, err)
			}
			return nil
		}
		shutCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := hs.Shutdown(shutCtx); err != nil {
			log.Warn("http shutdown", "addr", addr, "error", err)
		}
		<-done
		return nil
	}, nil
}

// commitFlushers is the API's group-commit concurrency; the pool gets room
// for it plus the reads.
const commitFlushers = 4

// Producer runs the producer API until ctx ends.
func Producer(ctx context.Context, cfg config.Config, opts Options) error {
	log := opts.logger()
	if err := api.CheckListenAddr(cfg.HTTPAddr, cfg.APIKeys); err != nil {
		return err
	}
	pool, err := Pool(ctx, cfg.PostgresURL, commitFlushers+8)
	if err != nil {
		return err
	}
	defer pool.Close()
	pub, insp, err := Publisher(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("connect broker: %w", err)
	}
	defer insp.Close()
	defer pub.Close()

	srv, err := api.New(api.Config{
		Store: store.New(pool), Publisher: pub, Inspector: insp,
		APIKeys: cfg.APIKeys, Backpressure: cfg.Backpressure, Limits: cfg.Limits,
		CommitFlushers: commitFlushers, Logger: log, Registry: newRegistry(),
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	if len(cfg.APIKeys) == 0 {
		log.Warn("no api_keys configured: serving UNAUTHENTICATED on loopback only; every job belongs to tenant default", "addr", cfg.HTTPAddr)
	}
	wait, err := serveHTTP(ctx, cfg.HTTPAddr, srv.Handler(), log, func(addr string) {
		log.Info("serving producer API", "addr", addr, "broker", cfg.Broker, "api_keys", len(cfg.APIKeys))
		if opts.Ready != nil {
			opts.Ready(addr)
		}
	})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Go(func() { srv.Run(ctx) })
	err = wait()
	wg.Wait()
	return err
}

// Consumer runs the rate-controlled workers until ctx ends, then shuts
// down gracefully (worker.shutdown_grace).
func Consumer(ctx context.Context, cfg config.Config, opts Options) error {
	log := opts.logger()
	if cfg.Provider.BaseURL == "" {
		return errors.New("config: provider.base_url (LLMQ_PROVIDER_BASE_URL) is required")
	}
	// Batched claims and completions run several round trips at once
	// beside heartbeats and hand-backs; pgx's default is max(4, CPUs).
	pool, err := Pool(ctx, cfg.PostgresURL, 16)
	if err != nil {
		return err
	}
	defer pool.Close()
	st := store.New(pool)

	sub, insp, err := Subscriber(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("connect broker: %w", err)
	}
	defer sub.Close()
	defer insp.Close()

	prov, err := provider.New(provider.Config{
		BaseURL: cfg.Provider.BaseURL, APIKey: cfg.Provider.APIKey, Timeout: cfg.Provider.Timeout,
		WaitTimeout: cfg.Provider.WaitTimeout, Stream: cfg.Provider.Stream, MaxConns: cfg.Worker.MaxInFlight,
		Transport: opts.ProviderTransport,
	})
	if err != nil {
		return err
	}
	defer prov.Close()

	reg := newRegistry()
	factory := worker.GovernorFactory(cfg.Models, cfg.Strategy, ratecontrol.WithLogger(log))
	govs := map[string]*ratecontrol.Governor{}
	for name := range cfg.Models {
		govs[name] = factory(name)
	}
	deps := worker.Deps{Store: st, Subscriber: sub, Provider: prov, Logger: log, Registerer: reg, Failpoint: opts.Failpoint,
		Governor: func(name string) *ratecontrol.Governor {
			if g, ok := govs[name]; ok {
				return g
			}
			return factory(name)
		}}

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	var coord *quota.Coordinator
	var coordWG sync.WaitGroup
	if cfg.Quota.Shared && len(cfg.Models) > 0 {
		coord = quota.New(pool, cfg.Worker.ID, cfg.Models, func(m string) quota.Governor { return govs[m] }, cfg.Quota,
			quota.WithLogger(log), quota.WithRegisterer(reg))
		deps.OnRateLimited = coord.Report429
		coordWG.Go(func() {
			if err := coord.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
				log.Warn("quota coordinator stopped", "error", err)
			}
		})
	}

	w, err := worker.New(worker.FromConfig(cfg), deps)
	if err != nil {
		return err
	}
	health := worker.Handler(reg,
		worker.Check{Name: "postgres", Check: st.Ping},
		worker.Check{Name: "broker", Check: func(ctx context.Context) error {
			_, err := insp.Depth(ctx, job.PriorityNormal)
			return err
		}},
	)
	httpCtx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHTTP()
	wait, err := serveHTTP(httpCtx, cfg.MetricsAddr, health, log, func(addr string) {
		log.Info("consumer started", "broker", cfg.Broker, "metrics_addr", addr, "models", len(cfg.Models), "worker_id", cfg.Worker.ID)
		if opts.Ready != nil {
			opts.Ready(addr)
		}
	})
	if err != nil {
		return err
	}

	if coord != nil {
		// A governor booked while its share is still zero would strand the
		// call; start consuming once every model has a share.
		select {
		case <-coord.Ready():
		case <-ctx.Done():
		}
	}
	runErr := w.Run(ctx)

	cancelRun()
	coordWG.Wait()
	if coord != nil {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := coord.Close(closeCtx); err != nil {
			log.Warn("quota lease hand-back", "error", err)
		}
		cancel()
	}
	// Health and metrics stay up through the drain, then stop.
	stopHTTP()
	if err := wait(); err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}
