package bench

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/worker"
)

// The offload scenario (`llmq bench --scenarios offload`): the same
// backlog, a low-lane bulk and a high-lane share, once all online and once
// with the low lane offloaded to provider batches (internal/offload),
// through the real worker, store and coordinator against llmsim on an
// in-memory broker. It prints each lane's completion time and cost (the
// model's price, the batch discount off for what a batch served).

// OffloadScenario shapes the offload comparison.
type OffloadScenario struct {
	HighJobs, LowJobs int
	// RPM is the provider's online limit (llmq is configured with it).
	RPM int64
	// BatchDelay is how long the simulated provider takes per batch.
	BatchDelay time.Duration
	// MaxJobs per batch.
	MaxJobs int
	Price   config.Price
	// Discount is the batch discount.
	Discount float64
	// Timeout bounds each run.
	Timeout time.Duration
}

// DefaultOffloadScenario is the scenario the command runs.
func DefaultOffloadScenario() OffloadScenario {
	return OffloadScenario{HighJobs: 100, LowJobs: 600, RPM: 1200, BatchDelay: 15 * time.Second, MaxJobs: 200,
		Price: config.Price{InputPerMillion: 0.8, OutputPerMillion: 2}, Discount: 0.5, Timeout: 5 * time.Minute}
}

// OffloadLane is one lane's outcome in one mode.
type OffloadLane struct {
	Lane               job.Priority
	Jobs, Succeeded    int
	ViaBatch           int
	P50, Last          time.Duration // completion after the start
	Cost               float64
	PromptTok, CompTok int64
}

// OffloadResult is one mode's run.
type OffloadResult struct {
	Mode             string // "all-online" or "offload"
	Lanes            []OffloadLane
	OnlineCalls      int64
	Uploads, Batches int
	Wall             time.Duration
}

// RunOffload runs the scenario all online, then with offload.
func RunOffload(ctx context.Context, env Env, sc OffloadScenario) ([]OffloadResult, error) {
	var out []OffloadResult
	for _, batch := range []bool{false, true} {
		r, err := runOffloadMode(ctx, env, sc, batch)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func runOffloadMode(ctx context.Context, env Env, sc OffloadScenario, batch bool) (OffloadResult, error) {
	res := OffloadResult{Mode: "all-online"}
	if batch {
		res.Mode = "offload"
	}
	pool, drop, err := FreshDatabase(ctx, env.PostgresURL)
	if err != nil {
		return res, err
	}
	defer drop()
	st := store.New(pool)
	simulator, err := sim.New(sim.Config{APIKeys: []string{benchKey},
		Models: map[string]sim.ModelConfig{Model: {RPM: sc.RPM}},
		Batch:  sim.BatchConfig{Delay: sim.Duration(sc.BatchDelay)}})
	if err != nil {
		return res, err
	}
	srv := httptest.NewServer(simulator)
	defer func() { simulator.Close(); srv.Close() }()
	pcfg := config.Provider{BaseURL: srv.URL + "/v1", APIKey: config.Secret(benchKey)}
	client, err := provider.New(provider.Config{BaseURL: pcfg.BaseURL, APIKey: pcfg.APIKey, Timeout: time.Minute, MaxConns: 64})
	if err != nil {
		return res, err
	}
	defer client.Close()

	m := config.Model{RPM: float64(sc.RPM), Price: sc.Price}
	if batch {
		m.Batch = config.Batch{Enabled: true, Lanes: []string{"low"}, MaxJobs: sc.MaxJobs, MaxBytes: 50 << 20,
			Gather: time.Second, CompletionWindow: time.Hour, Margin: time.Minute, Discount: sc.Discount,
			PollInterval: 500 * time.Millisecond, MaxOpen: 10}
	}
	models := map[string]config.Model{Model: m}
	mem := memory.New(memory.Config{})
	w, err := worker.New(worker.Config{Owner: "bench-offload", Lease: 2 * time.Minute, Prefetch: 256, RetryBase: time.Second,
		RetryMax: 10 * time.Second, ShutdownGrace: 2 * time.Second, Models: models},
		worker.Deps{Store: st, Subscriber: mem.Subscriber(), Provider: client, Governor: worker.GovernorFactory(models, "auto"), Logger: env.Logger})
	if err != nil {
		return res, err
	}
	coord, err := offload.New(offload.Params{Store: st, Lanes: mem.Publisher(), Logger: env.Logger, Interval: 200 * time.Millisecond,
		Models: map[string]offload.Model{Model: {Upstream: Model, Batch: m.Batch, API: offload.NewClient(pcfg)}}})
	if err != nil {
		return res, err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.Run(runCtx) })
	wg.Go(func() { _ = coord.Run(runCtx) })
	defer wg.Wait()
	defer stop()

	start := time.Now()
	if err := offloadBacklog(ctx, st, mem.Publisher(), sc); err != nil {
		return res, err
	}
	total := sc.HighJobs + sc.LowJobs
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(sc.Timeout)
	for done := 0; done < total; {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-deadline:
			return res, fmt.Errorf("offload bench (%s): %d of %d jobs finished within %v", res.Mode, done, total, sc.Timeout)
		case <-tick.C:
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status IN ('succeeded','failed','dead','cancelled')`).Scan(&done); err != nil {
			return res, err
		}
	}
	res.Wall = time.Since(start)
	res.OnlineCalls = simulator.Stats().Models[Model].Requests
	bs := simulator.BatchStats()
	res.Uploads, res.Batches = bs.Uploads, bs.Batches

	rows, err := pool.Query(ctx, `SELECT priority, status, completed_at, coalesce(prompt_tokens, 0), coalesce(completion_tokens, 0),
		coalesce(attempt_log->-1->>'kind', '') = 'batch' FROM jobs`)
	if err != nil {
		return res, err
	}
	defer rows.Close()
	byLane := map[job.Priority]*OffloadLane{}
	times := map[job.Priority][]time.Duration{}
	for rows.Next() {
		var lane, status string
		var at *time.Time
		var in, outTok int64
		var viaBatch bool
		if err := rows.Scan(&lane, &status, &at, &in, &outTok, &viaBatch); err != nil {
			return res, err
		}
		l := byLane[job.Priority(lane)]
		if l == nil {
			l = &OffloadLane{Lane: job.Priority(lane)}
			byLane[l.Lane] = l
		}
		l.Jobs++
		cost := sc.Price.Cost(in, outTok)
		if viaBatch {
			l.ViaBatch++
			cost *= 1 - sc.Discount
		}
		l.Cost += cost
		l.PromptTok, l.CompTok = l.PromptTok+in, l.CompTok+outTok
		if status == string(job.StatusSucceeded) && at != nil {
			l.Succeeded++
			times[l.Lane] = append(times[l.Lane], at.Sub(start))
		}
	}
	if err := rows.Err(); err != nil {
		return res, err
	}
	for _, lane := range []job.Priority{job.PriorityHigh, job.PriorityLow} {
		l := byLane[lane]
		if l == nil {
			continue
		}
		ts := times[lane]
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
		if len(ts) > 0 {
			l.P50, l.Last = ts[len(ts)/2], ts[len(ts)-1]
		}
		res.Lanes = append(res.Lanes, *l)
	}
	return res, nil
}

// offloadBacklog stores the scenario's jobs at once and publishes their
// wake-ups, as a backlog waiting in the lanes.
func offloadBacklog(ctx context.Context, st *store.Store, pub broker.Publisher, sc OffloadScenario) error {
	var jobs []job.Job
	for i := range sc.HighJobs + sc.LowJobs {
		lane, name := job.PriorityHigh, "high"
		if i >= sc.HighJobs {
			lane, name = job.PriorityLow, "low"
		}
		j := job.Job{ID: fmt.Sprintf("%s-%05d", name, i), Model: Model, Priority: lane,
			Request: fmt.Appendf(nil, `{"messages":[{"role":"user","content":"classify ticket %d: the printer is on fire again"}],"max_tokens":64}`, i)}
		j.Normalize()
		jobs = append(jobs, j)
	}
	if _, err := st.InsertBatch(ctx, jobs); err != nil {
		return err
	}
	for _, j := range jobs {
		if err := pub.Publish(ctx, j.Priority, broker.WakeUp(j.Key(), j.Model)); err != nil {
			return err
		}
	}
	return nil
}

// PrintOffload writes the comparison table.
func PrintOffload(w io.Writer, sc OffloadScenario, results []OffloadResult) {
	fmt.Fprintf(w, "offload: %d high + %d low jobs, provider %d RPM online, batches of %d taking %v, price %.2f/%.2f per M tokens, batch discount %.0f%%\n",
		sc.HighJobs, sc.LowJobs, sc.RPM, sc.MaxJobs, sc.BatchDelay, sc.Price.InputPerMillion, sc.Price.OutputPerMillion, sc.Discount*100)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tlane\tjobs\tsucceeded\tvia batch\tp50 done\tall done\tcost\t")
	for _, r := range results {
		for _, l := range r.Lanes {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.1fs\t%.1fs\t$%.5f\t\n", r.Mode, l.Lane, l.Jobs, l.Succeeded, l.ViaBatch,
				l.P50.Seconds(), l.Last.Seconds(), l.Cost)
		}
	}
	_ = tw.Flush()
	for _, r := range results {
		var cost float64
		for _, l := range r.Lanes {
			cost += l.Cost
		}
		fmt.Fprintf(w, "%s: all done in %.1fs, %d online calls, %d uploads, %d batches, cost $%.5f\n",
			r.Mode, r.Wall.Seconds(), r.OnlineCalls, r.Uploads, r.Batches, cost)
	}
}
