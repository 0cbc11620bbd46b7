package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/bench"
)

const (
	defaultBenchPostgres = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	defaultBenchAMQP     = "amqp://guest:guest@127.0.0.1:5672/"
)

// runBench is `llmq bench`: every strategy through every scenario, a table
// per scenario on stdout, charts and raw series in --out.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("llmq bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		scenarios  = fs.String("scenarios", "all", "comma-separated scenarios: steady, cold, mixed, halving, highconc (or all); or offload alone: the same backlog all online vs with the low lane offloaded to batches; or tasks alone: image-task jobs against a running-task limit")
		strategies = fs.String("strategies", "all", "comma-separated strategies: retry, ratelimit, shaping, adaptive, auto (or all)")
		out        = fs.String("out", "", "directory for <scenario>.png and results.json (empty: none; the figures in the repository are --out docs/bench)")
		brokerName = fs.String("broker", bench.BrokerMemory, "what jobs go through: memory, rabbitmq (LLMQ_AMQP_URL, a vhost per run made with rabbitmqctl) or kafka (LLMQ_KAFKA_BROKERS, else an in-process kfake); on a real broker half the jobs are published raw and half submitted over the producer API")
		sequential = fs.Bool("sequential", false, "run the strategies of a scenario one after another instead of side by side")
		seed       = fs.Uint64("seed", 1, "seed of the provider's fault injection")
		verbose    = fs.Bool("v", false, "log the workers' warnings to stderr")
		debug      = fs.Bool("debug", false, "log the governor's state every 5 s to stderr")
		list       = fs.Bool("list", false, "print the scenarios and their settings, run nothing")
		replot     = fs.String("replot", "", "render the charts of this results.json into --out, run nothing")

		duration    = fs.Duration("duration", 0, "override: run length of every scenario")
		concurrency = fs.Int("concurrency", 0, "override: retry workers / semaphore / max_concurrency")
		jobs        = fs.Int("jobs", 0, "override: total jobs (spread over the scenario's phases in proportion)")
		rpm         = fs.Int64("rpm", -1, "override: provider RPM (0 = none)")
		tpm         = fs.Int64("tpm", -1, "override: provider TPM (0 = none)")
		rps         = fs.Int64("rps", -1, "override: provider RPS (0 = none)")
		tps         = fs.Int64("tps", -1, "override: provider TPS (0 = none)")
		burstFloor  = fs.Int64("burst-floor", -1, "override: burst rule floor per second (0 = rule off)")
		warmup      = fs.Duration("warmup", 0, "override: warm-up of shaping and auto")
		shortTok    = fs.Int64("short-tokens", 0, "override: output tokens of a short answer")
		longTok     = fs.Int64("long-tokens", 0, "override: output tokens of a long answer")
		longShare   = fs.Float64("long-share", -1, "override: share of long answers")
		inputChars  = fs.Int("input-chars", 0, "override: prompt length in characters (≈ 4 per token)")
		errorRate   = fs.Float64("error-rate", -1, "override: share of provider 5xx")
		serverQueue = fs.Duration("server-queue", -1, "override: X-DashScope-Wait-Timeout auto sends (0 = none; retry, ratelimit, shaping and adaptive never send it)")
		taskPoll    = fs.String("task-poll", "", "tasks: comma-separated worker.task_poll_interval settings to run each strategy with (default 1s)")
		taskRunning = fs.Int64("task-running", 0, "tasks: override the provider's running-task limit (llmq's max_concurrency)")
		taskTime    = fs.Duration("task-duration", 0, "tasks: override the mean task duration")
	)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: llmq bench [flags]\n\nRuns each rate-control strategy through the real consumer path (worker, provider client,\ngovernor, Postgres store, a broker: --broker) against llmsim over loopback. Postgres comes from\nLLMQ_POSTGRES_URL (default "+defaultBenchPostgres+");\neach run gets a fresh database, dropped afterwards.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *replot != "" {
		if *out == "" {
			return errors.New("llmq bench: --replot needs --out, the directory for the charts")
		}
		return bench.Replot(*replot, *out)
	}
	var err error
	if *scenarios == "offload" {
		return runOffloadBench(ctx, *jobs, *rpm, *verbose, stdout, stderr)
	}
	if *scenarios == "tasks" {
		sc := bench.DefaultTasksScenario()
		if *jobs > 0 {
			sc.Jobs = *jobs
		}
		if *rpm > 0 {
			sc.RPM = *rpm
		}
		if *taskRunning > 0 {
			sc.Running = *taskRunning
		}
		if *taskTime > 0 {
			sc.TaskDuration = *taskTime
		}
		if *concurrency > 0 {
			sc.Workers = *concurrency
		}
		if *warmup != 0 {
			sc.Warmup = *warmup
		}
		if *strategies != "all" {
			if sc.Strategies, err = bench.ParseStrategies(*strategies); err != nil {
				return err
			}
		}
		if *taskPoll != "" {
			sc.PollIntervals = nil
			for _, v := range splitList(*taskPoll) {
				d, err := time.ParseDuration(v)
				if err != nil {
					return fmt.Errorf("--task-poll: %w", err)
				}
				sc.PollIntervals = append(sc.PollIntervals, d)
			}
		}
		return runTasksBench(ctx, sc, *verbose, *debug, stdout, stderr)
	}
	all, err := bench.SelectScenarios(bench.Scenarios(), *scenarios)
	if err != nil {
		return err
	}
	strats, err := bench.ParseStrategies(*strategies)
	if err != nil {
		return err
	}
	for i := range all {
		s := &all[i]
		if *duration > 0 {
			s.Duration = *duration
		}
		if *concurrency > 0 {
			s.Concurrency = *concurrency
		}
		if *jobs > 0 {
			total := 0
			for _, p := range s.Phases {
				total += p.Jobs
			}
			left := *jobs
			for j := range s.Phases {
				n := *jobs * s.Phases[j].Jobs / total
				if j == len(s.Phases)-1 {
					n = left
				}
				s.Phases[j].Jobs, left = n, left-n
			}
		}
		set := func(v int64, dst *int64) {
			if v >= 0 {
				*dst = v
			}
		}
		set(*rpm, &s.RPM)
		set(*tpm, &s.TPM)
		set(*rps, &s.RPS)
		set(*tps, &s.TPS)
		if *burstFloor == 0 {
			s.Burst.Floor, s.Burst.Growth, s.Burst.TokenFloor = 0, 0, 0
		} else if *burstFloor > 0 {
			s.Burst.Floor = *burstFloor
		}
		if *warmup != 0 {
			s.Warmup = *warmup
		}
		if *shortTok > 0 {
			s.Output.Short = *shortTok
		}
		if *longTok > 0 {
			s.Output.Long = *longTok
		}
		if *longShare >= 0 {
			s.Output.LongShare = *longShare
		}
		if *inputChars > 0 {
			s.InputChars = *inputChars
		}
		if *errorRate >= 0 {
			s.ErrorRate = *errorRate
		}
		if *serverQueue >= 0 {
			s.ServerQueue = *serverQueue
		}
		if err := s.Validate(); err != nil {
			return err
		}
	}
	if *list {
		for _, s := range all {
			fmt.Fprintf(stdout, "%-9s %v, rpm %d tpm %d rps %d tps %d, burst floor %d, concurrency %d, jobs %d, auto's server queue %v: %s\n",
				s.Name, s.Duration, s.RPM, s.TPM, s.RPS, s.TPS, s.Burst.Floor, s.Concurrency, sumJobs(s), s.ServerQueue, s.Description)
		}
		return nil
	}

	pg := os.Getenv("LLMQ_POSTGRES_URL")
	if pg == "" {
		pg = defaultBenchPostgres
	}
	level := slog.LevelError
	if *verbose {
		level = slog.LevelWarn
	}
	if *debug {
		level = slog.LevelDebug
	}
	if !slices.Contains(bench.Brokers, *brokerName) {
		return fmt.Errorf("--broker %q: want one of %s", *brokerName, strings.Join(bench.Brokers, ", "))
	}
	amqpURL := os.Getenv("LLMQ_AMQP_URL")
	if amqpURL == "" {
		amqpURL = defaultBenchAMQP
	}
	env := bench.Env{PostgresURL: pg, Seed: *seed, Broker: *brokerName, AMQPURL: amqpURL,
		KafkaBrokers: splitList(os.Getenv("LLMQ_KAFKA_BROKERS")),
		Logger:       slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))}
	start := time.Now()
	_, err = bench.RunSuite(ctx, bench.Options{Env: env, Scenarios: all, Strategies: strats, Out: *out,
		Sequential: *sequential, Stdout: stdout, Stderr: stderr})
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	fmt.Fprintf(stderr, "bench finished in %v", time.Since(start).Round(time.Second))
	if *out != "" {
		fmt.Fprintf(stderr, "; charts and results.json in %s", *out)
	}
	fmt.Fprintln(stderr)
	return nil
}

func sumJobs(s bench.Scenario) int {
	n := 0
	for _, p := range s.Phases {
		n += p.Jobs
	}
	return n
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// runOffloadBench is `llmq bench --scenarios offload` (bench.RunOffload);
// --jobs and --rpm override the backlog (a sixth high, the rest low) and
// the provider's online limit.
func runOffloadBench(ctx context.Context, jobs int, rpm int64, verbose bool, stdout, stderr io.Writer) error {
	sc := bench.DefaultOffloadScenario()
	if jobs > 0 {
		sc.HighJobs = max(jobs/7, 1)
		sc.LowJobs = jobs - sc.HighJobs
	}
	if rpm > 0 {
		sc.RPM = rpm
	}
	results, err := bench.RunOffload(ctx, standaloneEnv(verbose, false, stderr), sc)
	if err != nil {
		return fmt.Errorf("bench offload: %w", err)
	}
	bench.PrintOffload(stdout, sc, results)
	return nil
}

// runTasksBench is `llmq bench --scenarios tasks` (bench.RunTasks):
// --jobs, --rpm, --concurrency (the retry client's workers), --strategies,
// --warmup, --task-poll, --task-running and --task-duration override the
// scenario.
func runTasksBench(ctx context.Context, sc bench.TasksScenario, verbose, debug bool, stdout, stderr io.Writer) error {
	results, err := bench.RunTasks(ctx, standaloneEnv(verbose, debug, stderr), sc)
	if err != nil {
		return fmt.Errorf("bench tasks: %w", err)
	}
	bench.PrintTasks(stdout, sc, results)
	return nil
}

// standaloneEnv is the environment of the scenarios that run on their own
// (offload, tasks): Postgres from LLMQ_POSTGRES_URL, the run's log on
// stderr at error level, warn with verbose, debug with debug.
func standaloneEnv(verbose, debug bool, stderr io.Writer) bench.Env {
	pg := os.Getenv("LLMQ_POSTGRES_URL")
	if pg == "" {
		pg = defaultBenchPostgres
	}
	level := slog.LevelError
	if verbose {
		level = slog.LevelWarn
	}
	if debug {
		level = slog.LevelDebug
	}
	return bench.Env{PostgresURL: pg, Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))}
}
