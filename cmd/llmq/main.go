// Command llmq is the operator CLI:
//
//	llmq up [--config path] [--data dir]   the whole pipeline in one process
//	llmq bench [flags]                     the rate-control strategy comparison
//	llmq pollbench [flags]                 the long-poll benchmark
//	llmq replicas [flags]                  replicas with the default config sharing one quota
//	llmq soak [flags]                      30 minutes under faults: lost, duplicated, RSS
//	llmq cpushare [flags]                  the machine's CPU by command over a window
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "llmq:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  llmq up [--config path] [--data dir]   run producer API, two consumers, llmsim, Postgres and a Kafka-protocol broker in one process
  llmq bench [flags]                     compare rate-control strategies against llmsim (llmq bench -h)
  llmq pollbench [flags]                 long-poll latency and idle CPU of the producer API (llmq pollbench -h)
  llmq replicas [flags]                  consumer replicas with the default config sharing one quota against llmsim (llmq replicas -h)
  llmq soak [flags]                      the pipeline as processes for 30 minutes with consumer kills and broker/database restarts (llmq soak -h)
  llmq cpushare [flags]                  the machine's CPU time by command while a benchmark runs (llmq cpushare -h)`

func run(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return fmt.Errorf("missing subcommand")
	}
	switch args[0] {
	case "up":
		return runUp(ctx, args[1:], env, stdout, stderr)
	case "bench":
		return runBench(ctx, args[1:], stdout, stderr)
	case "pollbench":
		return runPollBench(ctx, args[1:], stdout, stderr)
	case "replicas":
		return runReplicasCmd(ctx, args[1:], env, stdout, stderr)
	case "soak":
		return runSoak(ctx, args[1:], env, stdout, stderr)
	case "cpushare":
		return runCPUShare(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	fmt.Fprintln(stderr, usage)
	return fmt.Errorf("unknown subcommand %q", args[0])
}
