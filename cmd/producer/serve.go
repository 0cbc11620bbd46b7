package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/store"
)

// commitFlushers is the API's group-commit concurrency; the pool gets room
// for it plus the reads.
const commitFlushers = 4

func serve(ctx context.Context, args []string, env func(string) (string, bool), stderr io.Writer) error {
	fs := newFlagSet("producer serve", stderr)
	path := fs.String("config", "", "YAML config file (default $LLMQ_CONFIG)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := loadConfig(*path, env)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if cfg.PostgresURL == "" {
		return errors.New("config: postgres_url (LLMQ_POSTGRES_URL) is required")
	}
	if err := api.CheckListenAddr(cfg.HTTPAddr, cfg.APIKeys); err != nil {
		return err
	}

	pcfg, err := pgxpool.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return fmt.Errorf("config: postgres_url: %w", err)
	}
	pcfg.MaxConns = max(pcfg.MaxConns, commitFlushers+8)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect postgres: %w", err)
	}
	defer pool.Close()
	if err := store.Migrate(ctx, pool); err != nil {
		return err
	}
	pub, insp, err := brokerClients(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("connect broker: %w", err)
	}
	defer insp.Close()
	defer pub.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := api.New(api.Config{
		Store: store.New(pool), Publisher: pub, Inspector: insp,
		APIKeys: cfg.APIKeys, Backpressure: cfg.Backpressure, Limits: cfg.Limits,
		CommitFlushers: commitFlushers, Logger: log, Registry: reg,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.HTTPAddr, err)
	}
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if len(cfg.APIKeys) == 0 {
		log.Warn("no api_keys configured: serving UNAUTHENTICATED on loopback only; every job belongs to tenant default", "addr", ln.Addr().String())
	}
	log.Info("serving producer API", "addr", ln.Addr().String(), "broker", cfg.Broker, "tenants", tenantCount(cfg.APIKeys))

	runCtx, stopRun := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { srv.Run(runCtx) })
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- hs.Serve(ln) })

	var err2 error
	select {
	case <-ctx.Done():
	case err2 = <-serveErr:
	}
	log.Info("shutting down producer API")
	shutCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutCtx); err != nil {
		log.Warn("http shutdown", "error", err)
	}
	stopRun()
	srv.Close()
	wg.Wait()
	if err2 != nil && !errors.Is(err2, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err2)
	}
	return nil
}

func tenantCount(keys config.APIKeys) int {
	seen := map[string]bool{}
	for _, t := range keys {
		seen[t] = true
	}
	return len(seen)
}
