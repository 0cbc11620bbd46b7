package launch

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/finished"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
)

// commitFlushers is the API's group-commit concurrency; the pool gets room
// for it plus the reads.
const commitFlushers = 4

// Producer runs the producer API until ctx ends.
func Producer(ctx context.Context, cfg config.Config, opts Options) error {
	log := opts.logger()
	defer holdHeapFloor(ctx, cfg)()
	// Admin keys alone also close the API: only keyless is loopback-only.
	if len(cfg.AdminKeys) == 0 {
		if err := api.CheckListenAddr(cfg.HTTPAddr, cfg.APIKeys); err != nil {
			return err
		}
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

	// One connection of its own, outside the pool, listens for finished
	// jobs for every long-poll of the process.
	listener, err := finished.New(finished.Config{
		Connect: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, cfg.PostgresURL) },
		Logger:  log,
	})
	if err != nil {
		return err
	}
	srv, err := api.New(api.Config{
		Store: store.New(pool).WithTimeout(cfg.PostgresTimeout), Publisher: pub, Inspector: insp, Finished: listener,
		APIKeys: cfg.APIKeys, AdminKeys: cfg.AdminKeys, Backpressure: cfg.Backpressure, Limits: cfg.Limits, Models: cfg.Models,
		BacklogLimits: backlogLimits(cfg),
		Destinations:  results.NewPolicy(cfg), BrokerTenants: brokerTenants(cfg),
		CommitFlushers: commitFlushers, Logger: log, Registry: newRegistry(), Failpoint: opts.Failpoint,
		Tracer: telemetry.New(opts.TracerProvider),
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	if len(cfg.APIKeys) == 0 && len(cfg.AdminKeys) == 0 {
		log.Warn("no api_keys configured: serving UNAUTHENTICATED on loopback only; every job belongs to tenant default", "addr", cfg.HTTPAddr)
	}
	// The web console is served beside the API it calls (internal/console).
	wait, err := serveHTTP(ctx, cfg.HTTPAddr, console.Mount(srv.Handler()), log, func(addr string) {
		log.Info("serving producer API", "addr", addr, "broker", cfg.Broker, "api_keys", len(cfg.APIKeys), "admin_keys", len(cfg.AdminKeys))
		if opts.Ready != nil {
			opts.Ready(addr)
		}
	})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Go(func() { srv.Run(ctx) })
	wg.Go(func() { listener.Run(ctx) })
	err = wait()
	wg.Wait()
	return err
}

// backlogLimits is each tenant's tenants.<name>.backlog_limit, for those
// that set one.
func backlogLimits(cfg config.Config) map[string]int64 {
	out := map[string]int64{}
	for name, t := range cfg.Tenants {
		if t.BacklogLimit > 0 {
			out[name] = t.BacklogLimit
		}
	}
	return out
}

// brokerTenants are the tenants with broker_users (api.Config.BrokerTenants).
func brokerTenants(cfg config.Config) map[string]bool {
	out := map[string]bool{}
	for name, t := range cfg.Tenants {
		if len(t.BrokerUsers) > 0 {
			out[name] = true
		}
	}
	return out
}
