package soak

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/bench"
	"github.com/llmq/llmq/internal/sim"
)

// Model is the one model the soak's jobs use.
const Model = "qwen-plus"

// Plan is one soak run.
type Plan struct {
	Duration  time.Duration // load phase
	Warmup    time.Duration // an incarnation's RSS at start is sampled this long after it started
	KillEvery time.Duration // consumer SIGKILL period
	Drain     time.Duration // most the soak waits after the load for every accepted job to finish
	Consumers int
	RPM, TPM  int64   // llmsim's limits, and the consumers' configured quota
	Load      float64 // submitted jobs per minute as a share of RPM

	PostgresURL string // a server: the run creates a database of its own
	AMQPURL     string // a vhost the run may fill (an empty one)
	// RestartRabbitMQ and RestartPostgres are shell commands that restart
	// the servers behind AMQPURL and PostgresURL; empty skips that fault.
	RestartRabbitMQ, RestartPostgres string
	ConsumerBin, ProducerBin         string
	WorkDir                          string // config and the processes' logs
	KeepDatabase                     bool
	Log                              *slog.Logger
}

// Report is everything the soak prints.
type Report struct {
	Plan         Plan
	Started      time.Time
	Rate         float64 // jobs submitted per second
	Summary      Summary
	NotAccepted  map[string]int // via → submissions given up on (never acknowledged)
	Faults       []FaultLog
	Procs        []Incarnation
	SimRequests  int64 // llmsim's own count, as a cross-check of the ledger's
	SimTokens    int64
	LoadMinutes  float64
	Drained      bool
	DrainTook    time.Duration
	DatabaseName string
}

// Run runs the plan: services are the caller's, processes and llmsim the soak's.
func Run(ctx context.Context, p Plan) (*Report, error) {
	log := p.Log
	rep := &Report{Plan: p, NotAccepted: map[string]int{}}
	if err := os.MkdirAll(p.WorkDir, 0o755); err != nil {
		return nil, err
	}
	pool, dropDB, err := bench.FreshDatabase(ctx, p.PostgresURL)
	if err != nil {
		return nil, err
	}
	rep.DatabaseName = pool.Config().ConnConfig.Database
	if p.KeepDatabase {
		defer pool.Close()
	} else {
		defer dropDB()
	}

	ledger := NewLedger()
	simURL, simulator, stopSim, err := startSim(p, ledger)
	if err != nil {
		return nil, err
	}
	defer stopSim()

	cfgPath, err := writeConfig(p)
	if err != nil {
		return nil, err
	}
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	common := []string{"LLMQ_CONFIG=" + cfgPath, "LLMQ_POSTGRES_URL=" + pool.Config().ConnString(), "LLMQ_BROKER=rabbitmq",
		"LLMQ_AMQP_URL=" + p.AMQPURL, "LLMQ_PROVIDER_BASE_URL=" + simURL, "LLMQ_PROVIDER_API_KEY=" + simKey}

	lctx, stopListen := context.WithCancel(ctx)
	ready := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { ListenResults(lctx, p.AMQPURL, ledger, log, ready) })
	defer func() { stopListen(); bg.Wait() }()
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Minute):
		return nil, fmt.Errorf("could not bind %s on %s within a minute", resultsQueue, p.AMQPURL)
	}

	producer := &Proc{Name: "producer", Path: p.ProducerBin, Args: []string{"serve"}, Supervise: true,
		Env: append(common, "LLMQ_HTTP_ADDR="+httpAddr), Log: LogPath(p.WorkDir, "producer")}
	procs := []*Proc{producer}
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].Stop(30 * time.Second)
		}
	}()
	if err := producer.Start(ctx); err != nil {
		return nil, err
	}
	base := "http://" + httpAddr
	if err := waitHealthy(ctx, base+"/readyz", time.Minute); err != nil {
		return nil, fmt.Errorf("producer: %w (see %s)", err, producer.Log)
	}
	consumers := map[string]*Proc{}
	for i := 1; i <= p.Consumers; i++ {
		name := ConsumerName(i)
		c := &Proc{Name: name, Path: p.ConsumerBin, Args: []string{"run"}, Supervise: true,
			Env: append(append([]string{}, common...), "LLMQ_WORKER_ID="+name, "LLMQ_METRICS_ADDR=127.0.0.1:0"), Log: LogPath(p.WorkDir, name)}
		if err := c.Start(ctx); err != nil {
			return nil, err
		}
		consumers[name] = c
		procs = append(procs, c)
	}
	log.Info("soak: processes started", "producer", producer.PID(), "consumers", p.Consumers, "api", base, "llmsim", simURL, "work_dir", p.WorkDir)

	self := &Incarnation{Name: "llmq soak (llmsim, submitters, ledger)", PID: os.Getpid(), Started: time.Now(), Witness: true}
	sample := func() {
		for _, pr := range procs {
			pr.Sample(p.Warmup)
		}
		if m, err := ReadMemory(self.PID); err == nil {
			self.record(m, time.Now(), p.Warmup)
		}
	}

	rep.Started = time.Now()
	rep.Rate = p.Load * float64(p.RPM) / 60
	loadCtx, endLoad := context.WithTimeout(ctx, p.Duration)
	defer endLoad()
	var work sync.WaitGroup
	work.Go(func() {
		for _, f := range Schedule(p.Duration, p.KillEvery, Victims(p.Consumers)) {
			select {
			case <-loadCtx.Done():
				return
			case <-time.After(time.Until(rep.Started.Add(f.At))):
			}
			fl := applyFault(ctx, f, p, consumers)
			log.Info("soak: fault", "kind", f.Kind, "target", f.Target, "took", fl.Took, "note", fl.Note)
			rep.Faults = append(rep.Faults, fl) // read only after work.Wait
		}
	})
	work.Go(func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-loadCtx.Done():
				return
			case <-t.C:
				sample()
			}
		}
	})
	raw := &amqpSubmitter{url: p.AMQPURL}
	notAccepted := submitLoad(loadCtx, ctx, rep.Rate, httpSubmitter{base: base, client: &http.Client{}}, raw, ledger, log)
	work.Wait()
	for _, pr := range procs {
		pr.Freeze(p.Warmup)
	}
	if m, err := ReadMemory(self.PID); err == nil {
		self.record(m, time.Now(), p.Warmup)
	}
	self.End = "running at the end of the load"
	for _, pr := range procs {
		rep.Procs = append(rep.Procs, pr.Incarnations()...)
	}
	rep.Procs = append(rep.Procs, *self)
	rep.LoadMinutes = time.Since(rep.Started).Minutes()

	drainStart := time.Now()
	rep.Drained = drain(ctx, pool, ledger, p.Drain, log, notAccepted)
	raw.mu.Lock()
	raw.close()
	raw.mu.Unlock()
	rep.DrainTook = time.Since(drainStart)
	for via, n := range notAccepted.counts() {
		rep.NotAccepted[via] = n
	}
	if err := readFinal(ctx, pool, ledger); err != nil {
		log.Warn("soak: last read of Postgres", "err", err)
	}
	rep.Summary = ledger.Summarize()
	st := simulator.Stats().Models[Model]
	rep.SimRequests = st.Requests
	for _, s := range st.Series {
		rep.SimTokens += s.Tokens
	}
	return rep, nil
}

// simKey is llmsim's only API key, so a call without it fails loudly.
const simKey = "sk-soak-llmsim-key-0001"

func startSim(p Plan, l *Ledger) (string, *sim.Simulator, func(), error) {
	s, err := sim.New(sim.Config{
		APIKeys: []string{simKey},
		Latency: sim.LatencyConfig{TTFT: sim.Duration(100 * time.Millisecond), TPT: sim.Duration(time.Millisecond)},
		Output:  sim.OutputMix{Short: 80, Long: 300, LongShare: 0.2},
		Models:  map[string]sim.ModelConfig{Model: {RPM: p.RPM, TPM: p.TPM}},
	}.WithDefaults())
	if err != nil {
		return "", nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	hs := &http.Server{Handler: CountCalls(s, l), ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	stop := func() {
		s.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}
	return "http://" + ln.Addr().String() + "/v1", s, stop, nil
}

// soakConfig is the processes' config file; the rest comes from LLMQ_*
// variables. Strategy auto with the quota llmsim enforces, as a user
// would configure it.
const soakConfig = `strategy: auto
models:
  %s:
    rpm: %d
    tpm: %d
    max_concurrency: 30
worker:
  shutdown_grace: 10s
`

func writeConfig(p Plan) (string, error) {
	path := p.WorkDir + "/llmq.yaml"
	return path, os.WriteFile(path, fmt.Appendf(nil, soakConfig, Model, p.RPM, p.TPM), 0o644)
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func waitHealthy(ctx context.Context, url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// applyFault kills a consumer or runs a restart command.
func applyFault(ctx context.Context, f Fault, p Plan, consumers map[string]*Proc) (fl FaultLog) {
	fl = FaultLog{Fault: f, Started: time.Now()}
	defer func() { fl.Took = time.Since(fl.Started) }()
	var cmd string
	switch f.Kind {
	case "kill":
		pid, err := consumers[f.Target].Kill()
		fl.Note = fmt.Sprintf("SIGKILL pid %d", pid)
		if err != nil {
			fl.Note += ": " + err.Error()
		}
		return fl
	case "restart-rabbitmq":
		cmd = p.RestartRabbitMQ
	case "restart-postgres":
		cmd = p.RestartPostgres
	}
	if cmd == "" {
		fl.Note = "skipped (no restart command given)"
		return fl
	}
	fl.Note = "`" + cmd + "`"
	// Output to a file, not a pipe: a restarted server may inherit the
	// command's stdout and would hold a pipe open for ever.
	out, err := os.OpenFile(LogPath(p.WorkDir, "faults"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fl.Note += " not run: " + err.Error()
		return fl
	}
	defer out.Close()
	fmt.Fprintf(out, "\n=== soak: %s at %s: %s\n", f.Kind, fl.Started.UTC().Format(time.RFC3339), cmd)
	c := exec.CommandContext(ctx, "sh", "-c", cmd)
	c.Stdout, c.Stderr = out, out
	if err := c.Run(); err != nil {
		fl.Note += fmt.Sprintf(" failed: %v (output in %s)", err, out.Name())
	}
	return fl
}

// readFinal books every job's status in Postgres on the ledger.
func readFinal(ctx context.Context, pool *pgxpool.Pool, l *Ledger) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT id, status FROM jobs WHERE tenant = 'default'`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			return err
		}
		l.Final(id, status)
	}
	return rows.Err()
}

// drain waits for every accepted job to be terminal with its event, up to max.
func drain(ctx context.Context, pool *pgxpool.Pool, l *Ledger, most time.Duration, log *slog.Logger, inflight *submissions) bool {
	deadline := time.Now().Add(most)
	for {
		inflight.wait(time.Until(deadline))
		if err := readFinal(ctx, pool, l); err != nil {
			log.Warn("soak: read Postgres during the drain", "err", err)
		}
		settled, open := l.Settled()
		if settled && inflight.pending() == 0 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			log.Warn("soak: drain ended with jobs open", "open", open)
			return false
		}
		log.Info("soak: draining", "open", open)
		select {
		case <-ctx.Done():
		case <-time.After(3 * time.Second):
		}
	}
}
