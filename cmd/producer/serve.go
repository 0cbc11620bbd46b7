package main

import (
	"context"
	"io"
	"log/slog"

	"github.com/llmq/llmq/internal/launch"
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
	return launch.Producer(ctx, cfg, launch.Options{Logger: log})
}
