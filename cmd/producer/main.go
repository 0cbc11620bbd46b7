// Command producer is llmq's producer side:
//
//	producer serve [--config path]
//	producer submit -f jobs.jsonl [--config path] [--concurrency n]
//
// serve runs the HTTP API (internal/api): it loads the configuration
// (--config or LLMQ_CONFIG, every scalar overridable by LLMQ_* variables),
// migrates Postgres, connects to the broker named by `broker`, and serves on
// http_addr until SIGINT or SIGTERM. With no api_keys it refuses a
// non-loopback address and says at start that it serves unauthenticated.
//
// submit streams a JSON-lines file (or stdin with -f -) straight onto the
// broker's intake with publisher confirms, several publishes in flight: each
// line is first validated with the job rules (and rejected with its line
// number and reason), a progress bar is drawn on a terminal (plain lines
// otherwise), and a summary closes the run. It makes sure the intake exists,
// then publishes through the public client package
// (github.com/llmq/llmq/client), as any producer does; a publish that fails
// for a passing reason (a lost connection, a full queue) is tried again for
// up to 30s. It exits non-zero if any line was rejected or not published.
// Re-running a file is safe: job IDs are idempotency keys and the consumer
// processes each (tenant, id) once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/llmq/llmq/internal/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  producer serve [--config path]
  producer submit -f jobs.jsonl|- [--config path] [--concurrency n]`

// run is the whole command, callable in-process by tests.
func run(ctx context.Context, args []string, env func(string) (string, bool), stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return errors.New("missing subcommand")
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], env, stderr)
	case "submit":
		return submit(ctx, args[1:], env, stdin, stdout, stderr)
	}
	fmt.Fprintln(stderr, usage)
	return fmt.Errorf("unknown subcommand %q", args[0])
}

// loadConfig reads --config (or LLMQ_CONFIG) and the environment.
func loadConfig(path string, env func(string) (string, bool)) (config.Config, error) {
	if path == "" {
		path, _ = env("LLMQ_CONFIG")
	}
	return config.Load(path, env)
}

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}
