package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/cpustat"
	"github.com/llmq/llmq/internal/finished"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/pgcodec"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
)

// envPollClient makes `llmq pollbench` the waiting client: the benchmark
// re-executes itself with it so that the client's goroutines, sockets and
// CPU are another process's than the producer's it measures.
const envPollClient = "LLMQ_POLLBENCH_CLIENT"

// pollPlan is what the producer tells its client process.
type pollPlan struct {
	Addr        string        `json:"addr"`
	PostgresURL string        `json:"postgres_url"`
	Producer    int           `json:"producer_pid"`
	Latency     int           `json:"latency_jobs"`
	Idle        int           `json:"idle_polls"`
	IdleFor     time.Duration `json:"idle_for"`
	Pace        time.Duration `json:"pace"`
}

// pollResult is what the client reports back on stdout.
type pollResult struct {
	Latencies   []time.Duration `json:"latencies"`
	ProducerCPU time.Duration   `json:"producer_cpu"`
	ClientCPU   time.Duration   `json:"client_cpu"`
	IdleWall    time.Duration   `json:"idle_wall"`
	Setup       time.Duration   `json:"setup"`
}

// runPollBench is `llmq pollbench`: an in-process producer API (Postgres,
// the job-finished listener, an in-memory broker) and a client process
// holding long-polls on it. It prints the completion-to-answer latency of
// jobs finished while long-polled and the producer's CPU while the idle
// long-polls wait.
func runPollBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if os.Getenv(envPollClient) != "" {
		return runPollClient(ctx, os.Stdin, stdout)
	}
	fs := flag.NewFlagSet("llmq pollbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		latency = fs.Int("jobs", 1000, "jobs finished while long-polled (latency)")
		idle    = fs.Int("idle", 10000, "long-polls held on jobs that do not finish (CPU)")
		idleFor = fs.Duration("idle-for", 20*time.Second, "how long the idle long-polls are measured")
		pace    = fs.Duration("pace", 2*time.Millisecond, "time between two finishes of the latency phase")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	raiseFileLimit()
	server := os.Getenv("LLMQ_POSTGRES_URL")
	if server == "" {
		server = defaultBenchPostgres
	}
	dbURL, drop, err := pollDatabase(ctx, server)
	if err != nil {
		return err
	}
	defer drop()
	pool, err := pgcodec.NewPool(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("connect postgres: %w", err)
	}
	defer pool.Close()
	if err := store.Migrate(ctx, pool); err != nil {
		return err
	}
	st := store.New(pool)
	if err := insertPollJobs(ctx, st, "lat", *latency); err != nil {
		return err
	}
	if err := insertPollJobs(ctx, st, "idle", *idle); err != nil {
		return err
	}

	listener, err := finished.New(finished.Config{Connect: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, dbURL) }})
	if err != nil {
		return err
	}
	mem := memory.New(memory.Config{})
	defer mem.Close()
	srv, err := api.New(api.Config{Store: st, Publisher: mem.Publisher(), Inspector: mem.Inspector(), Finished: listener})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { listener.Run(runCtx) })
	wg.Go(func() { srv.Run(runCtx) })
	wg.Go(func() { _ = hs.Serve(ln) })
	defer func() {
		stop()
		_ = hs.Close()
		wg.Wait()
	}()
	<-listener.Listening()

	plan := pollPlan{Addr: ln.Addr().String(), PostgresURL: dbURL, Producer: os.Getpid(),
		Latency: *latency, Idle: *idle, IdleFor: *idleFor, Pace: *pace}
	res, err := runClientProcess(ctx, plan, stderr)
	if err != nil {
		return err
	}
	printPollTable(stdout, plan, res)
	return nil
}

func insertPollJobs(ctx context.Context, st *store.Store, prefix string, n int) error {
	for from := 0; from < n; from += 1000 {
		var batch []job.Job
		for i := from; i < min(n, from+1000); i++ {
			batch = append(batch, job.Job{ID: fmt.Sprintf("%s-%d", prefix, i), Tenant: "default", Model: "qwen-plus",
				Priority: job.PriorityNormal, MaxAttempts: 3,
				Request: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":16}`)})
		}
		if _, err := st.InsertBatch(ctx, batch); err != nil {
			return fmt.Errorf("insert jobs: %w", err)
		}
	}
	return nil
}

// runClientProcess runs this binary again as the client, hands it the
// plan on stdin and reads its result from stdout.
func runClientProcess(ctx context.Context, plan pollPlan, stderr io.Writer) (pollResult, error) {
	self, err := os.Executable()
	if err != nil {
		return pollResult{}, err
	}
	cmd := exec.CommandContext(ctx, self, "pollbench")
	cmd.Env = append(os.Environ(), envPollClient+"=1")
	in, _ := json.Marshal(plan)
	cmd.Stdin = strings.NewReader(string(in))
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		return pollResult{}, fmt.Errorf("client process: %w", err)
	}
	var res pollResult
	if err := json.Unmarshal(out, &res); err != nil {
		return pollResult{}, fmt.Errorf("client process result: %w", err)
	}
	return res, nil
}

func printPollTable(w io.Writer, plan pollPlan, res pollResult) {
	lat := slices.Clone(res.Latencies)
	slices.Sort(lat)
	q := func(p float64) string {
		if len(lat) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f ms", float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds())/1000)
	}
	share := func(d time.Duration) string {
		return fmt.Sprintf("%.2f%% of a core", 100*d.Seconds()/res.IdleWall.Seconds())
	}
	fmt.Fprintf(w, "long-poll benchmark: %d jobs finished while long-polled (one every %s), %d idle long-polls held %s\n\n",
		plan.Latency, plan.Pace, plan.Idle, res.IdleWall.Round(time.Millisecond))
	fmt.Fprintln(w, "| measure | value | target |")
	fmt.Fprintln(w, "|---|---|---|")
	fmt.Fprintf(w, "| completion-to-answer p50 | %s | |\n", q(0.50))
	fmt.Fprintf(w, "| completion-to-answer p95 | %s | |\n", q(0.95))
	fmt.Fprintf(w, "| completion-to-answer p99 | %s | ≤ 100 ms |\n", q(0.99))
	fmt.Fprintf(w, "| completion-to-answer max | %s | |\n", q(1))
	fmt.Fprintf(w, "| jobs answered finished | %d of %d | all |\n", len(lat), plan.Latency)
	fmt.Fprintf(w, "| producer CPU, %d long-polls idle | %s | ≤ 5%% of a core |\n", plan.Idle, share(res.ProducerCPU))
	fmt.Fprintf(w, "| client CPU, same window | %s | |\n", share(res.ClientCPU))
	fmt.Fprintf(w, "| time to open the idle long-polls | %s | |\n", res.Setup.Round(time.Millisecond))
}

// raiseFileLimit lifts the soft limit on open files to the hard one: the
// benchmark holds one socket per long-poll on each side.
func raiseFileLimit() {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
}

// pollDatabase creates llmq_pollbench_<random> on server and returns its
// URL with a func that drops it.
func pollDatabase(ctx context.Context, server string) (string, func(), error) {
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return "", nil, fmt.Errorf("connect to Postgres (LLMQ_POSTGRES_URL): %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "llmq_pollbench_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(dctx, server); err == nil {
			_, _ = conn.Exec(dctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = conn.Close(dctx)
		}
	}
	u, err := url.Parse(server)
	if err != nil {
		drop()
		return "", nil, fmt.Errorf("parse Postgres URL: %w", err)
	}
	u.Path = "/" + name
	return u.String(), drop, nil
}

// runPollClient is the client process: it holds plan.Idle long-polls and
// measures the producer's CPU while they wait, then, with them still
// waiting, long-polls plan.Latency jobs and finishes them one by one in
// Postgres, timing each answer from its finish's commit.
func runPollClient(ctx context.Context, stdin io.Reader, stdout io.Writer) error {
	raiseFileLimit()
	var plan pollPlan
	if err := json.NewDecoder(bufio.NewReader(stdin)).Decode(&plan); err != nil {
		return fmt.Errorf("read plan: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: plan.Idle + plan.Latency, DisableCompression: true}}
	base := "http://" + plan.Addr
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	get := func(id string) (time.Time, bool) {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/jobs/"+id+"?wait=60s", nil)
		resp, err := hc.Do(req)
		at := time.Now()
		if err != nil {
			return at, false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return at, resp.StatusCode == http.StatusOK
	}
	start := time.Now()
	for i := range plan.Idle {
		wg.Go(func() { get(fmt.Sprintf("idle-%d", i)) })
	}
	if err := awaitWaiting(ctx, hc, base, plan.Idle); err != nil {
		return err
	}
	var res pollResult
	res.Setup = time.Since(start)

	p0, c0, t0 := cpustat.Proc(plan.Producer), cpustat.Process(), time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(plan.IdleFor):
	}
	res.ProducerCPU, res.ClientCPU, res.IdleWall = cpustat.Proc(plan.Producer)-p0, cpustat.Process()-c0, time.Since(t0)

	answers := make([]time.Time, plan.Latency)
	var answered sync.WaitGroup
	for i := range plan.Latency {
		answered.Go(func() {
			if at, ok := get(fmt.Sprintf("lat-%d", i)); ok {
				answers[i] = at
			}
		})
	}
	if err := awaitWaiting(ctx, hc, base, plan.Idle+plan.Latency); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, plan.PostgresURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// This process plays the consumer: it finishes the jobs and runs the
	// result relay, woken by each finish as a worker wakes it, whose
	// publish ends in the notification that answers the long-poll. The
	// latency therefore covers the whole production path.
	relayPool, err := pgcodec.NewPool(ctx, plan.PostgresURL)
	if err != nil {
		return err
	}
	defer relayPool.Close()
	mem := memory.New(memory.Config{})
	defer mem.Close()
	wake := make(chan struct{}, 1)
	relay := results.NewRelay(results.RelayParams{Store: store.New(relayPool), Publisher: mem.Publisher(), Wake: wake})
	relayCtx, stopRelay := context.WithCancel(ctx)
	var relayWG sync.WaitGroup
	relayWG.Go(func() { relay.Run(relayCtx) })
	defer func() { stopRelay(); relayWG.Wait() }()
	commits := make([]time.Time, plan.Latency)
	tick := time.NewTicker(plan.Pace)
	defer tick.Stop()
	for i := range plan.Latency {
		<-tick.C
		if _, err := conn.Exec(ctx, `UPDATE jobs SET status = 'cancelled', completed_at = now()
			WHERE tenant = 'default' AND id = $1`, fmt.Sprintf("lat-%d", i)); err != nil {
			return fmt.Errorf("finish job: %w", err)
		}
		commits[i] = time.Now()
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	answered.Wait()
	for i, at := range answers {
		if !at.IsZero() {
			res.Latencies = append(res.Latencies, max(at.Sub(commits[i]), 0))
		}
	}
	cancel() // the idle long-polls
	return json.NewEncoder(stdout).Encode(res)
}

// awaitWaiting polls the producer's llmq_api_long_polls_waiting until at
// least n long-polls wait.
func awaitWaiting(ctx context.Context, hc *http.Client, base string, n int) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if waiting(hc, base) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("fewer than %d long-polls waiting after a minute (%d)", n, waiting(hc, base))
}

func waiting(hc *http.Client, base string) int {
	resp, err := hc.Get(base + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "llmq_api_long_polls_waiting "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return int(f)
		}
	}
	return -1
}
