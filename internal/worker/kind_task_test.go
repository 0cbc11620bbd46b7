package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
)

func taskBody(id, model string) []byte {
	b, _ := json.Marshal(map[string]any{"id": id, "model": model, "kind": "task",
		"request": map[string]any{"input": map[string]string{"prompt": "a cat, " + id}, "parameters": map[string]int{"n": 1}}})
	return b
}

// Task jobs submit a DashScope task, keep its id in their row, poll it to
// the end and store the final answer; the model's concurrency limit holds
// the running tasks to llmsim's limit, so nothing is refused.
func TestTaskJobsEndToEnd(t *testing.T) {
	t.Parallel()
	const n = 6
	models := map[string]config.Model{"wanx": {Kind: "task", RPM: 120, MaxConcurrency: 2, Warmup: -1}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{
		"wanx": {Kind: sim.KindTask, RPM: 120, MaxRunningTasks: 2, TaskDuration: sim.Duration(400 * time.Millisecond)}}}, models)
	h.cfg.TaskPollInterval = 50 * time.Millisecond
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	bodies := make([][]byte, n)
	for i := range n {
		bodies[i] = taskBody(fmt.Sprintf("img-%d", i), "wanx")
	}
	h.submitMany(mem.Publisher(), bodies)
	h.start(mem.Subscriber(), h.cfg)
	require.Equal(t, map[string]int{"succeeded": n}, h.wait(n, 60*time.Second))

	for i := range n {
		rec, err := h.store.Get(context.Background(), job.Key{Tenant: job.DefaultTenant, ID: fmt.Sprintf("img-%d", i)})
		require.NoError(t, err)
		require.NotEmpty(t, rec.TaskID)
		var resp struct {
			Output struct {
				TaskID     string `json:"task_id"`
				TaskStatus string `json:"task_status"`
				Results    []struct {
					URL string `json:"url"`
				} `json:"results"`
			} `json:"output"`
		}
		require.NoError(t, json.Unmarshal(rec.Response, &resp))
		require.Equal(t, rec.TaskID, resp.Output.TaskID)
		require.Equal(t, sim.TaskSucceeded, resp.Output.TaskStatus)
		require.Len(t, resp.Output.Results, 1)
	}
	st, ts := h.sim.Stats().Models["wanx"], h.sim.TaskStats("wanx")
	require.EqualValues(t, n, ts.Submitted, "one submission per job")
	require.LessOrEqual(t, ts.PeakRunning, int64(2))
	require.Zero(t, ts.Overruns)
	require.Zero(t, st.RateLimitedTotal, "%v", st.RateLimited)
}

// A consumer that stops while a task runs leaves the task id in the job's
// row; the next consumer polls that task to the end and never submits
// another.
func TestTaskResumedAfterRestartIsNotSubmittedAgain(t *testing.T) {
	t.Parallel()
	models := map[string]config.Model{"wanx": {Kind: "task", RPM: 120, MaxConcurrency: 2, Warmup: -1}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{
		"wanx": {Kind: sim.KindTask, MaxRunningTasks: 2, TaskDuration: sim.Duration(3 * time.Second)}}}, models)
	h.cfg.TaskPollInterval = 50 * time.Millisecond
	h.cfg.ShutdownGrace = 50 * time.Millisecond // cut the poll: the task outlives the consumer
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	h.submit(mem.Publisher(), job.PriorityNormal, "img-r", taskBody("img-r", "wanx"))
	key := job.Key{Tenant: job.DefaultTenant, ID: "img-r"}
	_, stop := h.start(mem.Subscriber(), h.cfg)
	require.Eventually(t, func() bool {
		rec, err := h.store.Get(context.Background(), key)
		return err == nil && rec.TaskID != ""
	}, 30*time.Second, 10*time.Millisecond, "the task id is recorded while the task runs")
	stop()
	rec, err := h.store.Get(context.Background(), key)
	require.NoError(t, err)
	require.NotEqual(t, job.StatusSucceeded, rec.Status, "the task was still running when the consumer stopped")
	taskID := rec.TaskID

	h.start(mem.Subscriber(), h.cfg)
	require.Equal(t, map[string]int{"succeeded": 1}, h.wait(1, 60*time.Second))
	rec, err = h.store.Get(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, taskID, rec.TaskID)
	require.Contains(t, string(rec.Response), taskID)
	require.EqualValues(t, 1, h.sim.TaskStats("wanx").Submitted, "polled to completion, not submitted again")
}

// Once a task model's processing times are known (from the task answers'
// timestamps), a task is first polled when recent ones ended: a backlog of
// equal tasks is then polled about once a task after the first few,
// instead of every interval while it runs.
func TestTaskPollsScheduledFromLearnedTimes(t *testing.T) {
	t.Parallel()
	const (
		n        = 16
		running  = 2
		duration = 500 * time.Millisecond
		interval = 150 * time.Millisecond
	)
	models := map[string]config.Model{"wanx": {Kind: "task", RPM: 6000, MaxConcurrency: running, Warmup: -1}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{
		"wanx": {Kind: sim.KindTask, MaxRunningTasks: running, TaskDuration: sim.Duration(duration)}}}, models)
	h.cfg.TaskPollInterval = interval
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	bodies := make([][]byte, n)
	for i := range n {
		bodies[i] = taskBody(fmt.Sprintf("img-%d", i), "wanx")
	}
	h.submitMany(mem.Publisher(), bodies)
	h.start(mem.Subscriber(), h.cfg)
	require.Equal(t, map[string]int{"succeeded": n}, h.wait(n, 60*time.Second))

	ts := h.sim.TaskStats("wanx")
	require.EqualValues(t, n, ts.Submitted)
	require.Zero(t, ts.Overruns)
	// Tasks started before taskMinSamples ended are polled at once and
	// every interval: at most 2 + duration/interval polls. Every later one
	// is first polled when it has ended; one more poll of margin each.
	// Every-interval polling would take at least 4 polls a task here.
	unlearned := running + taskMinSamples - 1
	bound := unlearned*(2+int(duration/interval)) + (n-unlearned)*2
	require.LessOrEqual(t, ts.Polls, int64(bound), "polls of %d tasks", n)
}

// A task model's governor starts at its max_concurrency (the provider's
// running-task limit); a chat model's auto starts lower and probes.
func TestTaskModelGovernorStartsAtMaxConcurrency(t *testing.T) {
	models := map[string]config.Model{
		"wanx":      {Kind: "task", RPM: 300, MaxConcurrency: 8},
		"qwen-plus": {RPM: 300, MaxConcurrency: 8},
	}
	f := GovernorFactory(models, "auto")
	require.Equal(t, 8, f("wanx").Snapshot().ConcurrencyLimit)
	require.Less(t, f("qwen-plus").Snapshot().ConcurrencyLimit, 8)
}
