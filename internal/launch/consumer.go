package launch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/quota"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/reconcile"
	"github.com/llmq/llmq/internal/replicastat"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/retention"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/internal/webhook"
	"github.com/llmq/llmq/internal/worker"
)

// Consumer runs the rate-controlled workers until ctx ends, then shuts
// down gracefully (worker.shutdown_grace).
func Consumer(ctx context.Context, cfg config.Config, opts Options) error {
	log := opts.logger()
	tracer := telemetry.New(opts.TracerProvider)
	// Health and metrics answer once everything below is up; the port is
	// bound first (see listen).
	metricsLn, err := listen(cfg.MetricsAddr)
	if err != nil {
		return err
	}
	// For the returns before serveOn takes it over; after, the server's
	// shutdown has closed it and this Close is a no-op.
	defer metricsLn.Close()
	defer holdHeapFloor(ctx, cfg)()
	prov, closeProviders, err := providerRouter(cfg, opts)
	if err != nil {
		return err
	}
	defer closeProviders()
	// Batched claims and completions run several round trips at once
	// beside heartbeats and hand-backs; pgx's default is max(4, CPUs).
	pool, err := Pool(ctx, cfg.PostgresURL, 16)
	if err != nil {
		return err
	}
	defer pool.Close()
	st := store.New(pool).WithTimeout(cfg.PostgresTimeout)

	sub, insp, err := Subscriber(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("connect broker: %w", err)
	}
	defer sub.Close()
	defer insp.Close()
	intake, err := IntakeSubscriber(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("connect broker: %w", err)
	}
	defer intake.Close()
	lanes, lanesInsp, err := Publisher(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("connect broker: %w", err)
	}
	defer lanes.Close()
	defer lanesInsp.Close()

	reg := newRegistry()
	factory := worker.GovernorFactory(cfg.Models, cfg.Strategy, ratecontrol.WithLogger(log))
	govs := map[string]*ratecontrol.Governor{}
	for name := range cfg.Models {
		govs[name] = factory(name)
	}
	// Results stored wake the relay at once, so their events (and the
	// long-polls the relay's NOTIFY answers) wait for no poll interval.
	finished := make(chan struct{}, 1)
	deps := worker.Deps{Store: st, Subscriber: sub, Provider: prov, Logger: log, Registerer: reg, Failpoint: opts.Failpoint, Tracer: tracer,
		Lanes: lanes, TenantUsage: st.TokensToday,
		OnFinished: func() {
			select {
			case finished <- struct{}{}:
			default:
			}
		},
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
	switch {
	case cfg.Quota.Shared && len(cfg.Models) > 0:
		// The default: the quota belongs to the provider account, so every
		// replica on this Postgres takes a share of it, and a new one starts
		// from the others' calibration (internal/quota).
		log.Info("quota shared through Postgres", "worker_id", cfg.Worker.ID, "models", len(cfg.Models))
		// Keyed by provider and upstream model: the unit a provider limits.
		byKey, modelOf := quotaModels(cfg)
		coord = quota.New(pool, cfg.Worker.ID, byKey, func(k string) quota.Governor { return govs[modelOf[k]] }, cfg.Quota,
			quota.WithLogger(log), quota.WithRegisterer(reg))
		deps.OnRateLimited = func(model string, cl ratecontrol.Classification) { coord.Report429(cfg.QuotaKey(model), cl) }
		deps.TenantShare = func() float64 { return meanShare(coord.Shares()) }
		coordWG.Go(func() {
			if err := coord.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
				log.Warn("quota coordinator stopped", "error", err)
			}
		})
	case len(cfg.Models) > 0:
		log.Info("quota not shared (quota.shared: false): this replica applies every model's whole quota alone",
			"worker_id", cfg.Worker.ID)
	}

	w, err := worker.New(worker.FromConfig(cfg), deps)
	if err != nil {
		return err
	}
	ing, rec, err := intakeAndReconciler(cfg, st, intake, lanes, w, lanesInsp, log, reg, tracer)
	if err != nil {
		return err
	}
	// The webhook dispatcher sends the deliveries the result relay writes
	// (every consumer runs one; they share the work through Postgres).
	hooks, err := webhook.New(webhook.Params{Store: st, Tenants: cfg.Tenants, Webhooks: cfg.Webhooks, Logger: log, Registerer: reg, Tracer: tracer})
	if err != nil {
		return err
	}
	// Batch offload: one coordinator among the replicas drives the batches
	// of the models with batch: enabled (internal/offload); without such a
	// model its Run returns at once.
	batches, err := offload.New(offload.Params{Store: st, Models: offload.FromConfig(cfg), Lanes: lanes, Failpoint: opts.Failpoint,
		Logger: log.With("component", "offload"),
		Stored: func() {
			select {
			case finished <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		return err
	}
	var sideWG sync.WaitGroup
	// Every second the replica's per-model snapshot goes to Postgres for
	// the console's overview (internal/replicastat).
	reporter := replicaReporter(cfg, st, govs, w, coord, log)
	sideWG.Go(func() { reporter.Run(runCtx) })
	// A running job its tenant cancels has its provider call stopped.
	sideWG.Go(func() {
		store.ListenCancels(runCtx, func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, cfg.PostgresURL) },
			w.Abort, func(err error) { log.Warn("listen for cancellations", "error", err) })
	})
	sideWG.Go(func() {
		if err := ing.Run(runCtx); err != nil {
			log.Error("ingester stopped", "error", err)
		}
	})
	sideWG.Go(func() {
		if err := rec.Run(runCtx); err != nil {
			log.Error("reconciler stopped", "error", err)
		}
	})
	sideWG.Go(func() {
		if err := batches.Run(runCtx); err != nil {
			log.Error("batch coordinator stopped", "error", err)
		}
	})
	// Finished jobs and what they leave are deleted past their retention
	// (one active sweeper among the replicas).
	sweeper, err := retention.New(retention.FromConfig(cfg), st, nil, log, reg)
	if err != nil {
		return err
	}
	sideWG.Go(func() {
		if err := sweeper.Run(runCtx); err != nil {
			log.Error("retention sweeper stopped", "error", err)
		}
	})
	relay, err := resultRelay(cfg, st, lanes, finished, hooks.Kick, log, reg, opts.Failpoint, tracer)
	if err != nil {
		return err
	}
	sideWG.Go(func() { relay.Run(runCtx) })
	sideWG.Go(func() {
		if err := hooks.Run(runCtx); err != nil {
			log.Error("webhook dispatcher stopped", "error", err)
		}
	})
	health := worker.Handler(reg,
		worker.Check{Name: "postgres", Check: st.Ping},
		worker.Check{Name: "broker", Check: func(ctx context.Context) error {
			_, err := insp.Depth(ctx, job.PriorityNormal)
			return err
		}},
	)
	if cfg.Pprof {
		// A heap sample every 32 KB instead of 512: the profiles then show
		// where a megabyte went, which is the scale of a soak's RSS growth.
		runtime.MemProfileRate = 32 << 10
		health = withPprof(health)
	}
	httpCtx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHTTP()
	wait, err := serveOn(httpCtx, metricsLn, health, log, func(addr string) {
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
	sideWG.Wait()
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

// replicaReporter builds the writer of this replica's snapshots.
func replicaReporter(cfg config.Config, st *store.Store, govs map[string]*ratecontrol.Governor, w *worker.Worker,
	coord *quota.Coordinator, log *slog.Logger) *replicastat.Reporter {
	g := make(map[string]replicastat.Governor, len(govs))
	for m, gov := range govs {
		g[m] = gov
	}
	p := replicastat.Params{Store: st, ReplicaID: cfg.Worker.ID, Models: cfg.Models, Governors: g,
		Waiting: w.Waiting, Logger: log}
	if coord != nil {
		p.Shares = coord.Shares
	}
	return replicastat.New(p)
}

// resultRelay builds the relay that publishes the result events of
// finished jobs (internal/results).
func resultRelay(cfg config.Config, st *store.Store, pub broker.Publisher, wake <-chan struct{}, delivered func(), log *slog.Logger,
	reg prometheus.Registerer, failpoint func(string), tracer *telemetry.Tracer) (*results.Relay, error) {
	rp, ok := pub.(broker.ResultPublisher)
	if !ok {
		return nil, fmt.Errorf("broker %s cannot publish result events", cfg.Broker)
	}
	return results.NewRelay(results.RelayParams{
		Store: st, Publisher: rp, Wake: wake, Delivered: delivered, Log: log.With("component", "result_relay"),
		WebhookURLs: func(tenant string) string { return cfg.Tenants[tenant].WebhookURL },
		Metrics:     results.NewMetrics(reg), Failpoint: failpoint, Tracer: tracer,
	}), nil
}

// intakeAndReconciler builds the consumer's ingester (the intake into
// Postgres and the lanes) and its reconciler candidate.
func intakeAndReconciler(cfg config.Config, st *store.Store, intake broker.Subscriber, lanes broker.Publisher,
	runner ingest.Runner, insp broker.Inspector, log *slog.Logger, reg prometheus.Registerer, tracer *telemetry.Tracer) (*ingest.Ingester, *reconcile.Reconciler, error) {
	var names []string
	if len(cfg.Models) > 0 {
		for name := range cfg.Models {
			names = append(names, name)
		}
	}
	ing, err := ingest.New(ingest.Config{
		Prefetch: cfg.Ingest.Prefetch, CheckModels: func(j *job.Job) error { return config.CheckJobModels(cfg.Models, j) }, CheckDestination: results.NewPolicy(cfg).Check,
		BrokerUsers: cfg.BrokerUserTenants(),
		Limits:      cfg.Limits.Job(),
	}, ingest.Deps{Store: st, Intake: intake, Lanes: lanes, Runner: runner, Logger: log, Registerer: reg, Tracer: tracer})
	if err != nil {
		return nil, nil, err
	}
	var dlq broker.DeadLetterReader
	if r, ok := insp.(broker.DeadLetterReader); ok {
		dlq = r
	}
	rec, err := reconcile.New(reconcile.Config{Interval: cfg.Reconciler.Interval, LostAfter: cfg.Reconciler.LostAfter, Models: names,
		OrphanEvery: cfg.Worker.Lease / 10, BrokerUsers: cfg.BrokerUserTenants()},
		reconcile.Deps{Store: st, Lanes: lanes, Depth: insp, DeadLetters: dlq, Logger: log, Registerer: reg})
	if err != nil {
		return nil, nil, err
	}
	return ing, rec, nil
}

// meanShare is the replica's part of the tenants' own caps, which span
// every model: the mean of its request shares of the models' quotas.
func meanShare(shares map[string]quota.Share) float64 {
	if len(shares) == 0 {
		return 1
	}
	var sum float64
	for _, s := range shares {
		sum += s.Requests
	}
	return min(max(sum/float64(len(shares)), 0.01), 1)
}
