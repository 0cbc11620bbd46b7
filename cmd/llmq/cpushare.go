package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/internal/cpustat"
)

// runCPUShare is `llmq cpushare`: it splits the machine's CPU time over a
// window by command (Postgres, the consumer, the broker's node, a load
// generator, …), so a benchmark run by another tool can be read as "where
// did a job's cost go". With --while the window is the lifetime of a
// process of that name (it waits for one to start); with --for it is
// fixed. --jobs turns the seconds into µs per job.
func runCPUShare(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("llmq cpushare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		while    = fs.String("while", "", "measure while a process with this command name runs (waits for it to start)")
		length   = fs.Duration("for", 0, "measure for this long (with --while: at most this long)")
		jobs     = fs.Int("jobs", 0, "jobs done in the window: adds µs per job")
		interval = fs.Duration("interval", 200*time.Millisecond, "sampling interval (a process that lives shorter may be missed)")
		top      = fs.Int("top", 10, "commands listed")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *while == "" && *length <= 0 {
		return fmt.Errorf("cpushare: give --while NAME or --for DURATION")
	}
	if *while != "" {
		fmt.Fprintf(stderr, "cpushare: waiting for a process named %q\n", *while)
		for !cpustat.Running(*while) {
			if err := sleep(ctx, *interval); err != nil {
				return err
			}
		}
	}
	w, err := cpustat.NewWatch()
	if err != nil {
		return err
	}
	start := time.Now()
	for {
		if err := sleep(ctx, *interval); err != nil {
			return err
		}
		if err := w.Sample(); err != nil {
			return err
		}
		if *length > 0 && time.Since(start) >= *length {
			break
		}
		if *while != "" && !w.Alive(*while) {
			break
		}
	}
	printShares(stdout, w, time.Since(start), *jobs, *top)
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func printShares(out io.Writer, w *cpustat.Watch, window time.Duration, jobs, top int) {
	busy := w.Busy()
	fmt.Fprintf(out, "window %.1fs, machine busy %.1f CPU-s\n", window.Seconds(), busy.Seconds())
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := "command\tCPU-s\tshare of busy\t"
	if jobs > 0 {
		header += "µs/job\t"
	}
	fmt.Fprintln(tw, header)
	row := func(name string, d time.Duration) {
		line := fmt.Sprintf("%s\t%.2f\t%.1f%%\t", name, d.Seconds(), 100*d.Seconds()/max(busy.Seconds(), 1e-9))
		if jobs > 0 {
			line += fmt.Sprintf("%.0f\t", float64(d.Microseconds())/float64(jobs))
		}
		fmt.Fprintln(tw, line)
	}
	var listed time.Duration
	for i, s := range w.ByCommand() {
		if i >= top {
			break
		}
		row(s.Command, s.CPU)
		listed += s.CPU
	}
	irq := w.Interrupts()
	row("(interrupts)", irq)
	row("rest", max(busy-listed-irq, 0))
	row("machine", busy)
	tw.Flush()
}
