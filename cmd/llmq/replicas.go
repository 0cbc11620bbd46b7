package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/llmq/llmq/internal/bench"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/launch"
	"github.com/llmq/llmq/internal/sim"
)

// replicasPlan is one run of `llmq replicas`.
type replicasPlan struct {
	Replicas    int
	Minutes     int           // whole minutes measured after Settle
	Settle      time.Duration // warm-up and first rounds, not measured
	Restart     bool          // then stop one replica and start a newcomer
	Cold        bool          // delete the shared calibration before the newcomer starts
	Warmup      time.Duration // the model's warm-up
	Joined      time.Duration // the newcomer's window measured
	RPM, TPM    int64
	Jobs        int
	PostgresURL string                      // a server: the run creates a database of its own and drops it
	DatabaseURL string                      // instead, a migrated database to use as it is
	Env         func(string) (string, bool) // LLMQ_* variables over the default config
	Progress    io.Writer
}

// replicasResult is what llmsim, the referee, saw.
type replicasResult struct {
	Shared          bool
	Minutes         []sim.Second // per measured minute (Unix = its first second)
	SlidingTokens   int64        // most tokens admitted in any 60 s
	SlidingRequests int64
	Overruns        map[sim.Reason]int64
	Requests        int64 // calls that reached llmsim
	RateLimited     int64
	Binding         string  // "TPM" or "RPM": the dimension used most
	Goodput         float64 // of the binding limit, over the whole minutes
	Restart         *restartResult
}

type restartResult struct {
	Adopted     bool    // the newcomer started from the others' calibration
	Goodput     float64 // of the binding limit over its first window
	RateLimited int64   // 429s in that window
}

// replicasModel is the model the replicas share.
const replicasModel = "qwen-plus"

// runReplicasCmd is `llmq replicas`: N replicas with the default config
// against one llmsim, a table of whole minutes on stdout.
func runReplicasCmd(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("llmq replicas", flag.ContinueOnError)
	fs.SetOutput(stderr)
	p := replicasPlan{Env: env, Progress: stderr}
	fs.IntVar(&p.Replicas, "replicas", 3, "consumer replicas")
	fs.IntVar(&p.Minutes, "minutes", 2, "whole minutes measured")
	fs.DurationVar(&p.Settle, "settle", 15*time.Second, "warm-up before the measured minutes")
	fs.BoolVar(&p.Restart, "restart", true, "then stop one replica and measure a newcomer's first --joined")
	fs.BoolVar(&p.Cold, "cold", false, "delete the shared calibration before the newcomer starts (as before quota_learned)")
	fs.DurationVar(&p.Joined, "joined", 20*time.Second, "the newcomer's window")
	fs.DurationVar(&p.Warmup, "warmup", replicasWarmup, "the model's warm-up (30s is the default of a config without one)")
	fs.Int64Var(&p.RPM, "rpm", 1200, "provider RPM")
	fs.Int64Var(&p.TPM, "tpm", 150_000, "provider TPM")
	fs.IntVar(&p.Jobs, "jobs", 0, "jobs published (0: more than the quota lets through)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: llmq replicas [flags]\n\nRuns --replicas consumers (launch.Consumer, as `consumer run` builds them) with the default\nconfig (LLMQ_* variables apply: LLMQ_QUOTA_SHARED=false shows the opt-out) against one llmsim\nover loopback, with in-process Kafka and a fresh database on LLMQ_POSTGRES_URL (default "+defaultBenchPostgres+"),\nand prints what llmsim admitted per whole minute.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	p.PostgresURL = defaultBenchPostgres
	if u, ok := env("LLMQ_POSTGRES_URL"); ok && u != "" {
		p.PostgresURL = u
	}
	res, err := runReplicas(ctx, p)
	if err != nil {
		return err
	}
	printReplicas(stdout, p, res)
	return nil
}

// replicasWarmup is the model's warm-up unless --warmup says otherwise:
// short, so the measured minutes are not the ramp.
const replicasWarmup = 5 * time.Second

// replicasConfig is the whole config of a replica: models and provider
// only, so quota.* is the default.
const replicasConfig = `
strategy: auto
models:
  %s:
    rpm: %d
    tpm: %d
    max_concurrency: 30
    warmup: %s
worker:
  shutdown_grace: 5s
`

// runReplicas runs the plan and returns llmsim's accounting.
func runReplicas(ctx context.Context, p replicasPlan) (replicasResult, error) {
	var res replicasResult
	progress := func(format string, a ...any) {
		if p.Progress != nil {
			fmt.Fprintf(p.Progress, "llmq replicas: "+format+"\n", a...)
		}
	}
	env := p.Env
	if env == nil {
		env = func(string) (string, bool) { return "", false }
	}
	if p.Warmup == 0 {
		p.Warmup = replicasWarmup
	}
	cfg, err := config.Parse(fmt.Appendf(nil, replicasConfig, replicasModel, p.RPM, p.TPM, p.Warmup), env)
	if err != nil {
		return res, err
	}
	res.Shared = cfg.Quota.Shared

	dbURL := p.DatabaseURL
	if dbURL == "" {
		pool, dropDB, err := bench.FreshDatabase(ctx, p.PostgresURL)
		if err != nil {
			return res, err
		}
		defer dropDB()
		dbURL = pool.Config().ConnString()
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		return res, fmt.Errorf("start in-process Kafka: %w", err)
	}
	defer cluster.Close()
	simulator, err := sim.New(sim.Config{
		APIKeys: []string{"sk-replicas"},
		Latency: sim.LatencyConfig{TTFT: sim.Duration(30 * time.Millisecond), TPT: sim.Duration(200 * time.Microsecond)},
		Output:  sim.OutputMix{Short: 30, Long: 600, LongShare: 0.3},
		Models:  map[string]sim.ModelConfig{replicasModel: {RPM: p.RPM, TPM: p.TPM}},
	}.WithDefaults())
	if err != nil {
		return res, err
	}
	srv := httptest.NewServer(simulator)
	defer srv.Close()
	defer simulator.Close()

	cfg.PostgresURL = dbURL
	cfg.Broker, cfg.KafkaBrokers = "kafka", cluster.ListenAddrs()
	cfg.Provider.BaseURL, cfg.Provider.APIKey = srv.URL+"/v1", "sk-replicas"
	cfg.MetricsAddr = "127.0.0.1:0"

	// The backlog: ≈ 220 tokens a job at this output mix; more jobs than
	// the quota lets through in the run.
	jobs := p.Jobs
	if jobs <= 0 {
		run := p.Settle + time.Duration(p.Minutes)*time.Minute + p.Joined + 15*time.Second
		jobs = int(float64(p.TPM)/220*run.Minutes()*1.3) + 100
	}
	progress("publishing %d jobs", jobs)
	if err := publishReplicaJobs(ctx, cfg, jobs); err != nil {
		return res, err
	}

	reps := map[string]*replicaProc{}
	defer func() {
		for _, r := range reps {
			r.stop()
		}
	}()
	for i := 1; i <= p.Replicas; i++ {
		id := fmt.Sprintf("r%d", i)
		reps[id] = startReplica(ctx, cfg, id)
	}
	progress("%d replicas started (quota.shared=%v); settling %v, then %d whole minutes", p.Replicas, cfg.Quota.Shared, p.Settle, p.Minutes)
	if err := waitRun(ctx, reps, p.Settle); err != nil {
		return res, err
	}
	from := time.Now().Unix() + 1
	if err := waitRun(ctx, reps, time.Until(time.Unix(from+int64(p.Minutes)*60, 0))); err != nil {
		return res, err
	}

	if p.Restart {
		last := fmt.Sprintf("r%d", p.Replicas)
		reps[last].stop()
		delete(reps, last)
		if p.Cold {
			if err := forgetLearned(ctx, dbURL); err != nil {
				return res, err
			}
		}
		newcomer := fmt.Sprintf("r%d", p.Replicas+1)
		joined := time.Now().Unix() + 1
		reps[newcomer] = startReplica(ctx, cfg, newcomer)
		progress("%s stopped, %s joined; measuring %v", last, newcomer, p.Joined)
		if err := waitRun(ctx, reps, time.Until(time.Unix(joined, 0).Add(p.Joined))); err != nil {
			return res, err
		}
		st := simulator.Stats().Models[replicasModel]
		w := sumSeries(st.Series, joined, joined+int64(p.Joined.Seconds()))
		res.Restart = &restartResult{Adopted: reps[newcomer].adopted.Load(), RateLimited: w.RateLimited,
			Goodput: max(float64(w.Tokens)/float64(p.TPM), float64(w.Requests)/float64(p.RPM)) * 60 / p.Joined.Seconds()}
	}

	st := simulator.Stats().Models[replicasModel]
	res.Overruns, res.Requests, res.RateLimited = st.Overruns, st.Requests, st.RateLimitedTotal
	var tok, req int64
	for m := range p.Minutes {
		s := sumSeries(st.Series, from+int64(m)*60, from+int64(m+1)*60)
		s.Unix = from + int64(m)*60
		res.Minutes = append(res.Minutes, s)
		tok, req = tok+s.Tokens, req+s.Requests
	}
	res.SlidingTokens, res.SlidingRequests = sim.SlidingMinute(st.Series)
	minutes := float64(max(p.Minutes, 1))
	res.Binding, res.Goodput = "TPM", float64(tok)/float64(p.TPM)/minutes
	if r := float64(req) / float64(p.RPM) / minutes; r > res.Goodput {
		res.Binding, res.Goodput = "RPM", r
	}
	return res, nil
}

// forgetLearned deletes what the replicas shared of their calibration, so
// the next one starts cold.
func forgetLearned(ctx context.Context, dbURL string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, `DELETE FROM quota_learned`)
	return err
}

// replicaProc is one consumer replica in this process.
type replicaProc struct {
	cancel  context.CancelFunc
	done    chan error
	adopted atomic.Bool // logged that it started from another's calibration
	once    sync.Once
}

func startReplica(ctx context.Context, cfg config.Config, id string) *replicaProc {
	r := &replicaProc{done: make(chan error, 1)}
	c := cfg
	c.Worker.ID = id
	rctx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	log := slog.New(slog.NewJSONHandler(adoptionWatch{&r.adopted}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	go func() { r.done <- launch.Consumer(rctx, c, launch.Options{Logger: log}) }()
	return r
}

// stop ends the replica gracefully: the worker drains and the quota lease
// is handed back.
func (r *replicaProc) stop() {
	r.once.Do(func() {
		r.cancel()
		<-r.done
	})
}

// adoptionWatch is a log sink that notes the coordinator's line about
// starting from another replica's calibration.
type adoptionWatch struct{ seen *atomic.Bool }

func (w adoptionWatch) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("starting from another replica's calibration")) && bytes.Contains(p, []byte(`"calibration":true`)) {
		w.seen.Store(true)
	}
	return len(p), nil
}

// waitRun lets the replicas run for d and fails if one stops.
func waitRun(ctx context.Context, reps map[string]*replicaProc, d time.Duration) error {
	timer := time.NewTimer(max(d, 0))
	defer timer.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			for id, r := range reps {
				select {
				case err := <-r.done:
					r.done <- err
					return fmt.Errorf("replica %s stopped early: %v", id, err)
				default:
				}
			}
		}
	}
}

// publishReplicaJobs puts n jobs for the model on the normal intake.
func publishReplicaJobs(ctx context.Context, cfg config.Config, n int) error {
	pub, insp, err := launch.Publisher(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer pub.Close()
	defer insp.Close()
	for i := range n {
		id := fmt.Sprintf("replicas-%06d", i)
		body := fmt.Sprintf(`{"id":%q,"model":%q,"request":{"messages":[{"role":"user","content":"Summarise ticket %d: the printer on floor %d is out of toner again."}],"max_tokens":600}}`,
			id, replicasModel, i, i%9)
		if err := pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: []byte(body)}); err != nil {
			return fmt.Errorf("publish job %d: %w", i, err)
		}
	}
	return nil
}

// sumSeries adds the seconds in [from, to).
func sumSeries(series []sim.Second, from, to int64) sim.Second {
	var s sim.Second
	for _, x := range series {
		if x.Unix >= from && x.Unix < to {
			s.Requests += x.Requests
			s.Tokens += x.Tokens
			s.RateLimited += x.RateLimited
		}
	}
	return s
}

func printReplicas(w io.Writer, p replicasPlan, r replicasResult) {
	fmt.Fprintf(w, "llmq replicas: %d replicas, config without a quota section (quota.shared=%v), llmsim RPM %d TPM %d, %d whole minutes after %v\n\n",
		p.Replicas, r.Shared, p.RPM, p.TPM, p.Minutes, p.Settle)
	fmt.Fprintf(w, "| minute | requests | %% of RPM | tokens | %% of TPM | 429s |\n|---|---|---|---|---|---|\n")
	for i, m := range r.Minutes {
		fmt.Fprintf(w, "| %d | %d | %.1f%% | %d | %.1f%% | %d |\n", i+1, m.Requests, pct(m.Requests, p.RPM), m.Tokens, pct(m.Tokens, p.TPM), m.RateLimited)
	}
	fmt.Fprintf(w, "\ngoodput over the whole minutes: %.1f%% of the binding limit (%s)\n", 100*r.Goodput, r.Binding)
	fmt.Fprintf(w, "sliding-minute maximum: %d tokens (%.1f%% of TPM), %d requests (%.1f%% of RPM); llmsim overruns %v\n",
		r.SlidingTokens, pct(r.SlidingTokens, p.TPM), r.SlidingRequests, pct(r.SlidingRequests, p.RPM), r.Overruns)
	fmt.Fprintf(w, "429s: %d of %d calls (%.2f%%), whole run\n", r.RateLimited, r.Requests, pct(r.RateLimited, r.Requests))
	if r.Restart != nil {
		fmt.Fprintf(w, "newcomer (one replica stopped, a new one joined%s): started from the others' calibration: %v; first %v: %.1f%% of the binding limit, %d 429s\n",
			map[bool]string{true: ", shared calibration deleted first", false: ""}[p.Cold], r.Restart.Adopted, p.Joined, 100*r.Restart.Goodput, r.Restart.RateLimited)
	}
}

func pct(a, b int64) float64 { return 100 * float64(a) / float64(max(b, 1)) }
