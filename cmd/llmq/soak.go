package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/llmq/llmq/internal/soak"
)

// runSoak is `llmq soak`: the pipeline as real processes under load for
// --duration while consumers are SIGKILLed and RabbitMQ and Postgres
// restart, then a table of what became of every job.
func runSoak(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("llmq soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var p soak.Plan
	fs.DurationVar(&p.Duration, "duration", 30*time.Minute, "load phase")
	fs.DurationVar(&p.Warmup, "warmup", time.Minute, "a process's RSS at start is sampled this long after it started")
	fs.DurationVar(&p.KillEvery, "kill-every", 5*time.Minute, "SIGKILL a consumer this often (every consumer but the first, in turn)")
	fs.DurationVar(&p.Drain, "drain", 5*time.Minute, "most to wait after the load for every accepted job to finish")
	fs.IntVar(&p.Consumers, "consumers", 3, "consumer processes sharing the quota")
	fs.Int64Var(&p.RPM, "rpm", 1200, "llmsim's and the config's requests per minute")
	fs.Int64Var(&p.TPM, "tpm", 500_000, "llmsim's and the config's tokens per minute")
	fs.Float64Var(&p.Load, "load", 0.7, "jobs submitted per minute as a share of --rpm")
	fs.StringVar(&p.PostgresURL, "postgres-url", envOr(env, "LLMQ_POSTGRES_URL", defaultBenchPostgres), "Postgres server (the run creates a database of its own and drops it); default $LLMQ_POSTGRES_URL")
	fs.StringVar(&p.AMQPURL, "amqp-url", envOr(env, "LLMQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ vhost the run fills (use an empty one); default $LLMQ_AMQP_URL")
	fs.StringVar(&p.RestartRabbitMQ, "restart-rabbitmq-cmd", "", "shell command that restarts the RabbitMQ behind --amqp-url, e.g. 'rabbitmqctl stop_app && rabbitmqctl start_app' (required unless --no-restarts)")
	fs.StringVar(&p.RestartPostgres, "restart-postgres-cmd", "", "shell command that restarts the Postgres behind --postgres-url, e.g. 'pg_ctlcluster 16 main restart' (required unless --no-restarts)")
	noRestarts := fs.Bool("no-restarts", false, "run without the RabbitMQ and Postgres restarts")
	fs.StringVar(&p.ConsumerBin, "consumer-bin", "", "consumer binary (default: the one next to llmq, else go build ./cmd/consumer into --work-dir)")
	fs.StringVar(&p.ProducerBin, "producer-bin", "", "producer binary (default: the one next to llmq, else go build ./cmd/producer into --work-dir)")
	fs.StringVar(&p.WorkDir, "work-dir", filepath.Join(os.TempDir(), "llmq-soak"), "config, binaries and each process's log")
	fs.BoolVar(&p.KeepDatabase, "keep-database", false, "keep the run's database for inspection")
	verbose := fs.Bool("v", false, "log the soak's progress to stderr")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: llmq soak [flags]

Runs producer serve and --consumers consumer run as separate processes against llmsim (in this
process) on the RabbitMQ and Postgres you name, submits --load × --rpm jobs a minute for --duration
(half POST /v1/jobs, half raw onto the exchange llmq.jobs), SIGKILLs a consumer every --kill-every,
restarts RabbitMQ at 5/12 and Postgres at 7/12 of the run with the commands you give, waits for the
jobs to finish and prints accepted / succeeded / lost / duplicated, the 429 share, queue time and
each process's RSS. It restarts the servers you point it at: give it ones nobody else uses
(deploy/soak/run.sh starts a private RabbitMQ node and Postgres cluster and runs it).

flags:`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if !*noRestarts && (p.RestartRabbitMQ == "" || p.RestartPostgres == "") {
		return errors.New("soak: give --restart-rabbitmq-cmd and --restart-postgres-cmd (they restart the servers behind --amqp-url and --postgres-url), or --no-restarts")
	}
	if *noRestarts {
		p.RestartRabbitMQ, p.RestartPostgres = "", ""
	}
	if p.Consumers < 1 || p.Load <= 0 || p.RPM <= 0 || p.Duration <= 0 {
		return errors.New("soak: --consumers, --load, --rpm and --duration must be positive")
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	p.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := os.MkdirAll(p.WorkDir, 0o755); err != nil {
		return err
	}
	for _, b := range []struct {
		bin *string
		pkg string
	}{{&p.ConsumerBin, "./cmd/consumer"}, {&p.ProducerBin, "./cmd/producer"}} {
		if *b.bin == "" {
			var err error
			if *b.bin, err = soakBinary(ctx, b.pkg, p.WorkDir, stderr); err != nil {
				return err
			}
		}
	}
	rep, err := soak.Run(ctx, p)
	if err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	rep.Print(stdout)
	fmt.Fprintf(stderr, "llmq soak: logs in %s\n", p.WorkDir)
	if ok, why := rep.Verdict(0.10); !ok {
		return fmt.Errorf("soak failed: %v", why)
	}
	return nil
}

// soakBinary finds the binary of pkg: next to this llmq (an install or
// the image, where every binary sits in one directory), else built from
// the source tree in the working directory.
func soakBinary(ctx context.Context, pkg, workDir string, stderr io.Writer) (string, error) {
	name := filepath.Base(pkg)
	if self, err := os.Executable(); err == nil {
		if sibling := filepath.Join(filepath.Dir(self), name); sibling != self {
			if st, err := os.Stat(sibling); err == nil && !st.IsDir() {
				return sibling, nil
			}
		}
	}
	out := filepath.Join(workDir, name)
	build := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	build.Stdout, build.Stderr = stderr, stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("soak: no %s next to llmq, and go build %s failed (run from the repository root, or give --%s-bin): %w", name, pkg, name, err)
	}
	return out, nil
}

func envOr(env func(string) (string, bool), name, def string) string {
	if v, ok := env(name); ok && v != "" {
		return v
	}
	return def
}
