package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/worker"
)

// The tasks scenario (`llmq bench --scenarios tasks`): a backlog of
// DashScope image-task jobs (kind: task) against a model whose running
// tasks, not its submission rate, bind. Each strategy runs it in turn
// through the real ingester, worker and store against llmsim, with llmq's
// max_concurrency set to the provider's running-task limit. The table
// shows how full the strategy keeps the limit (mean running tasks from the
// first submission to the last task's end, as llmsim integrates them) and
// what it costs in 429s and polls.

// TaskModel is the task model the scenario uses.
const TaskModel = "wanx2.1-t2i-turbo"

// TasksScenario shapes the tasks comparison.
type TasksScenario struct {
	Jobs int
	// Running is the provider's limit of running tasks (llmq's
	// max_concurrency for the model).
	Running int64
	// TaskDuration is the mean processing time of a task; Spread spreads
	// it uniformly over ×[1−Spread, 1+Spread] (sim.ModelConfig.TaskSpread).
	TaskDuration time.Duration
	Spread       float64
	// RPM limits submissions (llmq is configured with it); it should not
	// bind.
	RPM int64
	// Workers is the naive retry client's number of workers (it does not
	// know the running-task limit).
	Workers int
	// Warmup is models.warmup of the task model (0: the default, as
	// deployed; -1: none).
	Warmup time.Duration
	// PollIntervals are the worker.task_poll_interval settings; every
	// strategy runs once with each.
	PollIntervals []time.Duration
	Strategies    []ratecontrol.Strategy
	// Timeout bounds each run.
	Timeout time.Duration
}

// DefaultTasksScenario is the scenario the command runs.
func DefaultTasksScenario() TasksScenario {
	return TasksScenario{Jobs: 80, Running: 4, TaskDuration: 3 * time.Second, Spread: 0.3, RPM: 300, Workers: 12,
		PollIntervals: []time.Duration{time.Second},
		Strategies:    []ratecontrol.Strategy{ratecontrol.StrategyRetry, ratecontrol.StrategyRateLimit, ratecontrol.StrategyAuto},
		Timeout:       5 * time.Minute}
}

// Validate reports the first unusable setting.
func (sc TasksScenario) Validate() error {
	switch {
	case sc.Jobs <= 0:
		return fmt.Errorf("tasks scenario: no jobs")
	case sc.Running <= 0:
		return fmt.Errorf("tasks scenario: the running-task limit must be positive")
	case sc.TaskDuration <= 0:
		return fmt.Errorf("tasks scenario: task duration must be positive")
	case sc.Workers <= 0:
		return fmt.Errorf("tasks scenario: retry's workers must be positive")
	case len(sc.PollIntervals) == 0 || slices.ContainsFunc(sc.PollIntervals, func(d time.Duration) bool { return d <= 0 }):
		return fmt.Errorf("tasks scenario: poll intervals must be positive")
	case len(sc.Strategies) == 0:
		return fmt.Errorf("tasks scenario: no strategy")
	}
	return nil
}

// TasksResult is one strategy's run with one poll interval.
type TasksResult struct {
	Strategy     string        `json:"strategy"`
	PollInterval time.Duration `json:"poll_interval"`
	Jobs         int           `json:"jobs"`
	Succeeded    int           `json:"succeeded"`
	// Wall is from the first publish to the last job's end.
	Wall time.Duration `json:"wall"`
	// Submissions reached the provider; RateLimited are the 429s among
	// them (llmsim's count), Submitted the tasks it admitted.
	Submissions int64 `json:"submissions"`
	RateLimited int64 `json:"rate_limited"`
	Submitted   int64 `json:"submitted"`
	// Overruns of the running-task limit (llmsim's referee) and the peak
	// of running tasks at a submission.
	Overruns    int64 `json:"overruns"`
	PeakRunning int64 `json:"peak_running"`
	// Occupancy is the mean number of running tasks from the first
	// submission to the last task's end, as a share of the limit.
	Occupancy float64 `json:"occupancy"`
	// PollsPerTask is llmsim's task queries per admitted task.
	PollsPerTask float64 `json:"polls_per_task"`
	// QueueP50 and QueueP99: from a job's publish to its task's accepted
	// submission.
	QueueP50 time.Duration `json:"queue_p50"`
	QueueP99 time.Duration `json:"queue_p99"`
}

// RunTasks runs every strategy with every poll interval, one after
// another (each with its own simulator, database and worker).
func RunTasks(ctx context.Context, env Env, sc TasksScenario) ([]TasksResult, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	var out []TasksResult
	for _, poll := range sc.PollIntervals {
		for _, s := range sc.Strategies {
			r, err := runTasksOnce(ctx, env, sc, s, poll)
			if err != nil {
				return out, fmt.Errorf("tasks bench (%s, poll %v): %w", s, poll, err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func runTasksOnce(ctx context.Context, env Env, sc TasksScenario, strategy ratecontrol.Strategy, poll time.Duration) (TasksResult, error) {
	res := TasksResult{Strategy: string(strategy), PollInterval: poll, Jobs: sc.Jobs}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("scenario", "tasks", "strategy", string(strategy))
	pool, drop, err := FreshDatabase(ctx, env.PostgresURL)
	if err != nil {
		return res, err
	}
	defer drop()
	st := &notifyStore{Store: store.New(pool), want: int64(sc.Jobs), done: make(chan struct{})}

	simulator, err := sim.New(sim.Config{APIKeys: []string{benchKey}, Headers: sim.HeaderConfig{RetryAfter: true, RateLimit: true},
		Models: map[string]sim.ModelConfig{TaskModel: {Kind: sim.KindTask, RPM: sc.RPM, MaxRunningTasks: sc.Running,
			TaskDuration: sim.Duration(sc.TaskDuration), TaskSpread: sc.Spread}}})
	if err != nil {
		return res, err
	}
	srv := httptest.NewServer(simulator)
	defer func() { simulator.Close(); srv.Close() }()
	client, err := provider.New(provider.Config{BaseURL: srv.URL + "/v1", APIKey: config.Secret(benchKey),
		Timeout: 30 * time.Second, MaxConns: sc.Workers + 16})
	if err != nil {
		return res, fmt.Errorf("provider client: %w", err)
	}
	defer client.Close()
	prov := newTaskProvider(client, strategy == ratecontrol.StrategyRetry)

	models := map[string]config.Model{TaskModel: {Kind: string(job.KindTask), RPM: float64(sc.RPM),
		MaxConcurrency: int(sc.Running), Strategy: string(strategy), Warmup: sc.Warmup}}
	wcfg := worker.Config{Owner: "bench-tasks-" + string(strategy), Lease: 2 * time.Minute, Prefetch: 256,
		RetryBase: time.Second, RetryMax: time.Minute, ShutdownGrace: 2 * time.Second, Models: models, TaskPollInterval: poll}
	maxAttempts := 6
	if strategy == ratecontrol.StrategyRetry {
		// N workers, each holding its job through its own backoff.
		wcfg.MaxInFlight, wcfg.Prefetch = sc.Workers, sc.Workers
		maxAttempts = 1
	}
	rb, err := openBroker(ctx, env, log)
	if err != nil {
		return res, fmt.Errorf("broker: %w", err)
	}
	defer rb.close()
	w, ing, govs, err := pipeline(st, rb, prov, wcfg, models, strategy, log)
	if err != nil {
		return res, err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	workerErr := make(chan error, 1)
	wg.Go(func() { workerErr <- w.Run(runCtx) })
	wg.Go(func() { _ = ing.Run(runCtx) })
	if log.Enabled(ctx, slog.LevelDebug) {
		wg.Go(func() { logGovernor(runCtx, log, govs) })
	}
	defer wg.Wait()
	defer stop()

	start := time.Now()
	published := map[string]time.Time{}
	submit := rawSubmit(rb.raw)
	for i := range sc.Jobs {
		id := fmt.Sprintf("img-%05d", i)
		published[id] = time.Now()
		if err := submit(ctx, id, taskJobBody(id, maxAttempts)); err != nil {
			return res, fmt.Errorf("publish: %w", err)
		}
	}
	timeout := time.NewTimer(sc.Timeout)
	defer timeout.Stop()
	select {
	case <-st.done:
	case <-timeout.C:
		return res, fmt.Errorf("%d of %d jobs finished within %v", st.terminal.Load(), sc.Jobs, sc.Timeout)
	case err := <-workerErr:
		return res, fmt.Errorf("worker stopped: %v", err)
	case <-ctx.Done():
		return res, ctx.Err()
	}

	ms, ts := simulator.Stats().Models[TaskModel], simulator.TaskStats(TaskModel)
	res.Submissions, res.RateLimited, res.Submitted = ms.Requests, ms.RateLimitedTotal, ts.Submitted
	res.Overruns, res.PeakRunning = ts.Overruns, ts.PeakRunning
	res.Occupancy = ts.MeanRunning() / float64(sc.Running)
	if ts.Submitted > 0 {
		res.PollsPerTask = float64(ts.Polls) / float64(ts.Submitted)
	}
	var last time.Time
	rows, err := jobRows(ctx, pool)
	if err != nil {
		return res, err
	}
	for _, r := range rows {
		if r.Status == job.StatusSucceeded {
			res.Succeeded++
		}
		if r.CompletedAt != nil && r.CompletedAt.After(last) {
			last = *r.CompletedAt
		}
	}
	res.Wall = last.Sub(start)
	var queue []float64
	for id, at := range prov.accepted() {
		if p, ok := published[id]; ok {
			queue = append(queue, at.Sub(p).Seconds())
		}
	}
	slices.Sort(queue)
	if len(queue) > 0 {
		res.QueueP50 = time.Duration(quantile(queue, 0.5) * float64(time.Second))
		res.QueueP99 = time.Duration(quantile(queue, 0.99) * float64(time.Second))
	}
	return res, nil
}

// taskJobBody is one image-task job message; its prompt carries the job id
// (jobMarker) so the provider wrapper can tell which job a submission is.
func taskJobBody(id string, maxAttempts int) []byte {
	body, _ := json.Marshal(map[string]any{"id": id, "model": TaskModel, "kind": string(job.KindTask), "max_attempts": maxAttempts,
		"request": map[string]any{"input": map[string]string{"prompt": jobMarker + id + "] a lighthouse in a storm, oil painting"},
			"parameters": map[string]int{"n": 1}}})
	return body
}

// PrintTasks writes the comparison table.
func PrintTasks(w io.Writer, sc TasksScenario, results []TasksResult) {
	fmt.Fprintf(w, "tasks: %d image-task jobs, provider limit %d running tasks (llmq max_concurrency %d), tasks of %v ±%.0f%%, submissions %d RPM, retry with %d workers\n",
		sc.Jobs, sc.Running, sc.Running, sc.TaskDuration, sc.Spread*100, sc.RPM, sc.Workers)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\tpoll\tjobs\tsucceeded\twall\tsubmissions\t429s\toverruns\tpeak running\toccupancy\tpolls/task\tqueue p50\tqueue p99\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%v\t%d\t%d\t%.1fs\t%d\t%d\t%d\t%d\t%.1f%%\t%.1f\t%.1fs\t%.1fs\t\n", r.Strategy, r.PollInterval, r.Jobs, r.Succeeded,
			r.Wall.Seconds(), r.Submissions, r.RateLimited, r.Overruns, r.PeakRunning, r.Occupancy*100, r.PollsPerTask,
			r.QueueP50.Seconds(), r.QueueP99.Seconds())
	}
	_ = tw.Flush()
}
