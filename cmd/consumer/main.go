// Command consumer runs llmq's rate-controlled workers:
//
//	consumer run [--config path]
//
// It loads the configuration (--config or LLMQ_CONFIG, every scalar
// overridable by LLMQ_* variables), migrates Postgres, connects to the
// broker named by `broker` (rabbitmq or kafka), builds one governor per
// model, shares each model's quota and calibration with the other replicas
// on the same Postgres (quota.shared, on by default), serves /metrics, /healthz and /readyz on metrics_addr, and consumes until
// SIGINT or SIGTERM, then finishes in-flight calls within
// worker.shutdown_grace and hands the rest back.
//
// LLMQ_FAILPOINT is for tests only: "after_provider_call[:n]" or
// "after_result_write[:n]" makes the process SIGKILL itself the n-th time
// it passes that point (see internal/worker/failpoint.go). Never set it in
// production.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/launch"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/telemetry"
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
	tp, stopTracing, err := telemetry.FromEnv(ctx, "llmq-consumer", env)
	if err != nil {
		return err
	}
	defer stopTracing()
	opts := launch.Options{Logger: log, TracerProvider: tp, Ready: func(addr string) {
		fmt.Fprintf(stdout, "consumer: metrics on http://%s/metrics\n", addr)
	}}
	// TEST-ONLY: LLMQ_FAILPOINT=<point>[:n] makes this process SIGKILL
	// itself the n-th time it passes the point (worker/failpoint.go).
	if spec, ok := env("LLMQ_FAILPOINT"); ok && spec != "" {
		fp, err := worker.ParseFailpoint(spec, func(name string) {
			log.Warn("failpoint reached: killing this process", "failpoint", name)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}, append([]string{results.FailpointRelayBeforePublish, results.FailpointRelayAfterPublish}, offload.Failpoints...)...)
		if err != nil {
			return err
		}
		opts.Failpoint = fp
	}
	return launch.Consumer(ctx, cfg, opts)
}
