// Command llmsim serves the provider simulator of internal/sim: an
// OpenAI/DashScope-compatible chat API that enforces RPM, TPM, RPS, TPS and
// burst limits, for tests, benchmarks and the local stack.
//
//	llmsim --addr 127.0.0.1:8090 [--config sim.yaml]
//
// Without --config it serves sim.DefaultConfig. It stops gracefully on
// SIGINT or SIGTERM.
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
	"sort"
	"syscall"
	"time"

	"github.com/llmq/llmq/internal/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "llmsim:", err)
		os.Exit(1)
	}
}

// shutdownGrace bounds how long in-flight requests may take to finish.
const shutdownGrace = 10 * time.Second

// run serves until ctx ends. ready, when non-nil, receives the bound
// address once the listener is open (for tests and --addr with port 0).
func run(ctx context.Context, args []string, stderr io.Writer, ready func(net.Addr)) error {
	fs := flag.NewFlagSet("llmsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8090", "listen address host:port")
	configPath := fs.String("config", "", "simulator YAML (models, dialect, burst, latency, faults, output, api_keys, headers); default: built-in qwen-plus and qwen-flash")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	cfg := sim.DefaultConfig()
	if *configPath != "" {
		var err error
		if cfg, err = sim.LoadConfig(*configPath); err != nil {
			return err
		}
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	s, err := sim.New(cfg, sim.WithLogger(logger))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *addr, err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	names := make([]string, 0, len(cfg.Models))
	for n := range cfg.Models {
		names = append(names, n)
	}
	sort.Strings(names)
	logger.Info("llmsim listening", "addr", ln.Addr().String(), "base_url", "http://"+ln.Addr().String()+"/v1",
		"models", names, "dialect", cfg.Dialect, "auth", len(cfg.APIKeys) > 0)
	if ready != nil {
		ready(ln.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("llmsim shutting down")
	s.Close() // release hanging and queued requests
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
