// Command consumer runs llmq's rate-controlled workers:
//
//	consumer run [--config path]
//
// It loads the configuration (--config or LLMQ_CONFIG, every scalar
// overridable by LLMQ_* variables), migrates Postgres, connects to the
// broker named by `broker` (rabbitmq or kafka), builds one governor per
// model, shares the quota with other replicas when quota.shared is set,
// serves /metrics, /healthz and /readyz on metrics_addr, and consumes until
// SIGINT or SIGTERM, then finishes in-flight calls within
// worker.shutdown_grace and hands the rest back.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

const usage = "usage: consumer run [--config path]"

// run is the whole command, callable in-process by tests: it returns when
// ctx ends (after a graceful shutdown) or on a fatal error.
func run(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "run" {
		fmt.Fprintln(stderr, usage)
		return errors.New("unknown or missing subcommand")
	}
	fs := flag.NewFlagSet("consumer run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "YAML config file (default $LLMQ_CONFIG)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *path == "" {
		*path, _ = env("LLMQ_CONFIG")
	}
	cfg, err := config.Load(*path, env)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if cfg.PostgresURL == "" {
		return errors.New("config: postgres_url (LLMQ_POSTGRES_URL) is required")
	}
	if cfg.Provider.BaseURL == "" {
		return errors.New("config: provider.base_url (LLMQ_PROVIDER_BASE_URL) is required")
	}

	pcfg, err := pgxpool.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return errors.New("config: postgres_url: cannot be parsed") // the URL may hold a password
	}
	if !strings.Contains(cfg.PostgresURL, "pool_max_conns") {
		// Batched claims and completions run several round trips at once
		// beside heartbeats and hand-backs; pgx's default is max(4, CPUs).
		pcfg.MaxConns = 16
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pool.Close()
	if err := store.Migrate(ctx, pool); err != nil {
		return err
	}
	st := store.New(pool)

	sub, ready, closeBroker, err := openBroker(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeBroker()

	maxConns := cfg.Worker.MaxInFlight
	prov, err := provider.New(provider.Config{
		BaseURL: cfg.Provider.BaseURL, APIKey: cfg.Provider.APIKey, Timeout: cfg.Provider.Timeout,
		WaitTimeout: cfg.Provider.WaitTimeout, Stream: cfg.Provider.Stream, MaxConns: maxConns,
	})
	if err != nil {
		return err
	}
	defer prov.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	govs := map[string]*ratecontrol.Governor{}
	factory := worker.GovernorFactory(cfg.Models, cfg.Strategy, ratecontrol.WithLogger(log))
	for name := range cfg.Models {
		govs[name] = factory(name)
	}
	govFor := func(name string) *ratecontrol.Governor {
		if g, ok := govs[name]; ok {
			return g
		}
		return factory(name)
	}
	deps := worker.Deps{Store: st, Subscriber: sub, Provider: prov, Governor: govFor, Logger: log, Registerer: reg}
	// TEST-ONLY: LLMQ_FAILPOINT=<point>[:n] makes this process SIGKILL
	// itself the n-th time it passes the point (worker/failpoint.go).
	if spec, ok := env("LLMQ_FAILPOINT"); ok && spec != "" {
		fp, err := worker.ParseFailpoint(spec, func(name string) {
			log.Warn("failpoint reached: killing this process", "failpoint", name)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		})
		if err != nil {
			return err
		}
		deps.Failpoint = fp
	}

	var coordDone chan error
	var coord *quota.Coordinator
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	if cfg.Quota.Shared && len(cfg.Models) > 0 {
		coord = quota.New(pool, cfg.Worker.ID, cfg.Models, func(m string) quota.Governor { return govs[m] }, cfg.Quota,
			quota.WithLogger(log), quota.WithRegisterer(reg))
		deps.OnRateLimited = coord.Report429
		coordDone = make(chan error, 1)
		go func() { coordDone <- coord.Run(runCtx) }()
	}

	w, err := worker.New(worker.FromConfig(cfg), deps)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("metrics_addr: %w", err)
	}
	srv := &http.Server{Handler: worker.Handler(reg,
		worker.Check{Name: "postgres", Check: st.Ping},
		worker.Check{Name: "broker", Check: ready},
	), ReadHeaderTimeout: 5 * time.Second}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(ln) }()
	log.Info("consumer started", "broker", cfg.Broker, "metrics_addr", ln.Addr().String(), "models", len(cfg.Models), "worker_id", cfg.Worker.ID)
	fmt.Fprintf(stdout, "consumer: metrics on http://%s/metrics\n", ln.Addr())

	runErr := w.Run(ctx)

	cancelRun()
	if coord != nil {
		<-coordDone
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := coord.Close(closeCtx); err != nil {
			log.Warn("quota lease hand-back", "error", err)
		}
		cancel()
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutCtx)
	<-srvDone
	return runErr
}

// openBroker connects the configured driver's subscriber and an inspector
// used as the readiness probe.
func openBroker(ctx context.Context, cfg config.Config, log *slog.Logger) (broker.Subscriber, func(context.Context) error, func(), error) {
	var (
		sub  broker.Subscriber
		insp broker.Inspector
		err  error
	)
	switch cfg.Broker {
	case "kafka":
		kc := kafka.Config{Brokers: cfg.KafkaBrokers, Logger: log}
		if sub, err = kafka.NewSubscriber(ctx, kc); err != nil {
			return nil, nil, nil, err
		}
		if insp, err = kafka.NewInspector(ctx, kc); err != nil {
			sub.Close()
			return nil, nil, nil, err
		}
	default:
		rc := rabbitmq.Config{URL: cfg.AMQPURL.Reveal(), MaxLength: int(cfg.Backpressure.LaneMaxLength), Logger: log}
		if sub, err = rabbitmq.NewSubscriber(ctx, rc); err != nil {
			return nil, nil, nil, err
		}
		if insp, err = rabbitmq.NewInspector(ctx, rc); err != nil {
			sub.Close()
			return nil, nil, nil, err
		}
	}
	ready := func(ctx context.Context) error {
		_, err := insp.Depth(ctx, job.PriorityNormal)
		return err
	}
	closeAll := func() {
		insp.Close()
		sub.Close()
	}
	return sub, ready, closeAll, nil
}
