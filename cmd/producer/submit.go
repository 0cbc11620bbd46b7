package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/launch"
)

// maxReportedProblems caps the per-line reasons printed in the summary.
const maxReportedProblems = 50

// problem is a line that was not enqueued.
type problem struct {
	line   int
	id     string
	reason string
}

// item is a validated line on its way to the broker.
type item struct {
	line int
	job  client.Job
}

// tally counts a submit run; safe for concurrent use.
type tally struct {
	read      atomic.Int64 // bytes read
	lines     atomic.Int64
	accepted  atomic.Int64
	rejected  atomic.Int64 // failed validation
	failed    atomic.Int64 // not confirmed by the broker
	mu        sync.Mutex
	problems  []problem
	nProblems int
}

func (t *tally) add(p problem) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nProblems++
	if len(t.problems) < maxReportedProblems {
		t.problems = append(t.problems, p)
	}
}

func submit(ctx context.Context, args []string, env func(string) (string, bool), stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("producer submit", stderr)
	path := fs.String("config", "", "YAML config file (default $LLMQ_CONFIG)")
	file := fs.String("f", "", "JSON-lines file of jobs, or - for stdin (required)")
	concurrency := fs.Int("concurrency", 64, "publishes in flight at once")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *file == "" {
		fmt.Fprintln(stderr, usage)
		return errors.New("submit: -f is required (a file, or - for stdin)")
	}
	if *concurrency < 1 {
		return errors.New("submit: --concurrency must be at least 1")
	}
	cfg, err := loadConfig(*path, env)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	in, size := stdin, int64(0)
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			return fmt.Errorf("submit: %w", err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil {
			size = st.Size()
		}
		in = f
	}
	// submit is llmq's own tool: it makes sure the intake exists, then
	// publishes as any producer does, through the public client package.
	if err := launch.DeclareIntake(ctx, cfg, log); err != nil {
		return fmt.Errorf("connect broker: %w", err)
	}
	pub, err := intakePublisher(cfg)
	if err != nil {
		return fmt.Errorf("connect broker: %w", err)
	}
	defer pub.Close()

	lim := cfg.Limits.Job().WithDefaults()
	t := &tally{}
	prog := newProgress(stderr, size, t)
	prog.start()
	start := time.Now()
	readErr := stream(ctx, in, lim, pub, *concurrency, t)
	prog.stop()
	elapsed := time.Since(start)

	fmt.Fprintf(stdout, "submitted %d lines in %s: %d accepted, %d rejected, %d failed (%.0f jobs/s)\n",
		t.lines.Load(), elapsed.Round(time.Millisecond), t.accepted.Load(), t.rejected.Load(), t.failed.Load(),
		float64(t.accepted.Load())/max(elapsed.Seconds(), 1e-9))
	for _, p := range t.problems {
		if p.id != "" {
			fmt.Fprintf(stdout, "  line %d (id %s): %s\n", p.line, p.id, p.reason)
		} else {
			fmt.Fprintf(stdout, "  line %d: %s\n", p.line, p.reason)
		}
	}
	if more := t.nProblems - len(t.problems); more > 0 {
		fmt.Fprintf(stdout, "  … and %d more\n", more)
	}
	if readErr != nil {
		return fmt.Errorf("submit: %w", readErr)
	}
	if bad := t.rejected.Load() + t.failed.Load(); bad > 0 {
		return fmt.Errorf("submit: %d of %d lines were not enqueued", bad, t.lines.Load())
	}
	return nil
}

// intakePublisher opens the public client's publisher for the configured
// broker.
func intakePublisher(cfg config.Config) (client.Publisher, error) {
	if cfg.Broker == "kafka" {
		return client.NewKafkaPublisher(cfg.KafkaBrokers)
	}
	return client.NewAMQPPublisher(cfg.AMQPURL.Reveal())
}

// stream reads lines, validates each and publishes the valid ones with
// `concurrency` publishes in flight. It returns a read error or ctx's error;
// per-line problems go to t.
func stream(ctx context.Context, in io.Reader, lim job.Limits, pub client.Publisher, concurrency int, t *tally) error {
	work := make(chan item, concurrency)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for it := range work {
				if err := publish(ctx, pub, it.job); err != nil {
					t.failed.Add(1)
					t.add(problem{line: it.line, id: it.job.ID, reason: "not published: " + err.Error()})
					continue
				}
				t.accepted.Add(1)
			}
		})
	}
	err := readLines(ctx, in, lim.MaxPayloadBytes, t, func(n int, line []byte) {
		j, err := job.Parse(line, time.Now(), lim)
		var cj client.Job
		if err == nil {
			// The strict parse accepted it: the client's type reads it all.
			err = json.Unmarshal(line, &cj)
		}
		if err != nil {
			t.rejected.Add(1)
			t.add(problem{line: n, id: j.ID, reason: err.Error()})
			return
		}
		select {
		case work <- item{line: n, job: cj}:
		case <-ctx.Done():
		}
	})
	close(work)
	wg.Wait()
	return err
}

// publishTimeout bounds the attempts at one line.
const publishTimeout = 30 * time.Second

// publish publishes j, trying again with backoff what the client calls
// retryable (a lost connection, an intake queue at its length limit, a
// confirm that never came) until publishTimeout: the job ID makes a repeat
// harmless.
func publish(ctx context.Context, pub client.Publisher, j client.Job) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	delay := 100 * time.Millisecond
	var last error // the last retryable failure, more telling than ctx's end
	for {
		err := pub.Publish(ctx, j)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil && last != nil:
			return last
		case !client.IsRetryable(err):
			return err
		}
		last = err
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return last
		case <-t.C:
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// readLines calls fn with each non-blank line (without its newline; a copy
// the callee may keep). A line longer than limit is rejected without being
// held in memory.
func readLines(ctx context.Context, in io.Reader, limit int, t *tally, fn func(n int, line []byte)) error {
	r := bufio.NewReaderSize(in, 64<<10)
	n := 0
	var buf []byte
	tooLong := false
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		chunk, err := r.ReadSlice('\n')
		t.read.Add(int64(len(chunk)))
		if !tooLong {
			buf = append(buf, chunk...)
			if len(buf) > limit+2 { // +2: the line ending
				tooLong, buf = true, buf[:0]
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if len(chunk) > 0 || tooLong || len(buf) > 0 {
			n++
			line := bytes.TrimSpace(buf)
			switch {
			case tooLong:
				t.lines.Add(1)
				t.rejected.Add(1)
				t.add(problem{line: n, reason: fmt.Sprintf("invalid job: line is over the %d byte limit", limit)})
			case len(line) > 0:
				t.lines.Add(1)
				fn(n, bytes.Clone(line))
			}
			buf, tooLong = buf[:0], false
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read line %d: %w", n+1, err)
		}
	}
}

// progress draws a bar on a terminal, plain lines elsewhere.
type progress struct {
	w     io.Writer
	tty   bool
	size  int64
	t     *tally
	every time.Duration
	done  chan struct{}
	wg    sync.WaitGroup
	begin time.Time
}

func newProgress(w io.Writer, size int64, t *tally) *progress {
	p := &progress{w: w, size: size, t: t, every: 5 * time.Second, done: make(chan struct{})}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty, p.every = true, 200*time.Millisecond
		}
	}
	return p
}

func (p *progress) start() {
	p.begin = time.Now()
	p.wg.Go(func() {
		tick := time.NewTicker(p.every)
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-tick.C:
				p.draw()
			}
		}
	})
}

func (p *progress) stop() {
	close(p.done)
	p.wg.Wait()
	if p.tty {
		p.draw()
		fmt.Fprintln(p.w)
	}
}

func (p *progress) draw() {
	acc, rej, fail := p.t.accepted.Load(), p.t.rejected.Load(), p.t.failed.Load()
	rate := float64(acc) / max(time.Since(p.begin).Seconds(), 1e-9)
	counts := fmt.Sprintf("%d accepted, %d rejected, %d failed, %.0f jobs/s", acc, rej, fail, rate)
	if !p.tty {
		fmt.Fprintf(p.w, "progress: %s\n", counts)
		return
	}
	if p.size <= 0 {
		fmt.Fprintf(p.w, "\r%s", counts)
		return
	}
	frac := min(float64(p.t.read.Load())/float64(p.size), 1)
	const width = 30
	filled := int(frac * width)
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
	fmt.Fprintf(p.w, "\r[%s] %3.0f%% %s", bar, frac*100, counts)
}
