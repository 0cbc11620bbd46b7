package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"syscall"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/launch"
	"github.com/llmq/llmq/internal/telemetry"
)

// serve runs the producer API (launch.Producer) until ctx ends.
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
	tp, stopTracing, err := telemetry.FromEnv(ctx, "llmq-producer", env)
	if err != nil {
		return err
	}
	defer stopTracing()
	opts := launch.Options{Logger: log, TracerProvider: tp}
	// TEST-ONLY: LLMQ_FAILPOINT=replay_after_commit makes this process
	// SIGKILL itself between a DLQ replay's commit and its publish
	// (api.FailpointReplayAfterCommit).
	if spec, ok := env("LLMQ_FAILPOINT"); ok && spec != "" {
		if spec != api.FailpointReplayAfterCommit {
			return fmt.Errorf("failpoint %q: the producer knows only %s", spec, api.FailpointReplayAfterCommit)
		}
		opts.Failpoint = func(name string) {
			log.Warn("failpoint reached: killing this process", "failpoint", name)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	return launch.Producer(ctx, cfg, opts)
}
