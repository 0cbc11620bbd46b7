package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// The image-task scenario: a model whose running tasks, not its
// submission rate, bind.
const (
	taskJobs       = 12
	taskRunning    = 3 // llmsim's and llmq's limit of running tasks
	taskRPM        = 120
	taskProcessing = 2 * time.Second
)

// TestImageTasksEndToEnd: image task jobs published to the intake run over
// RabbitMQ and Postgres on DashScope's native task API: each is submitted
// once, its task id recorded, polled to SUCCEEDED and its answer stored;
// the model's max_concurrency holds the running tasks to llmsim's limit
// (no 429 on either unit, no overrun).
func TestImageTasksEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs tasks of seconds over real services: not in -short")
	}
	s, pub, pool, logs := kindsConsumer(t, sim.Config{APIKeys: []string{"sk-kinds-test"}, Models: map[string]sim.ModelConfig{
		"wanx2.1-t2i-turbo": {Kind: sim.KindTask, RPM: taskRPM, MaxRunningTasks: taskRunning, TaskDuration: sim.Duration(taskProcessing)},
	}}, fmt.Sprintf(`models:
  wanx2.1-t2i-turbo: {kind: task, rpm: %d, max_concurrency: %d}
`, taskRPM, taskRunning))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i := range taskJobs {
		id := fmt.Sprintf("img-%03d", i)
		body := fmt.Sprintf(`{"id":%q,"model":"wanx2.1-t2i-turbo","kind":"task","request":{"input":{"prompt":"a cat, take %d"},"parameters":{"n":1}}}`, id, i)
		require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: []byte(body)}))
	}
	waitFinished(t, pool, taskJobs, 2*time.Minute, logs)

	st, ts := s.sim.Stats().Models["wanx2.1-t2i-turbo"], s.sim.TaskStats("wanx2.1-t2i-turbo")
	t.Logf("tasks: %d submissions, %d admitted, peak %d running (limit %d), 429s %v, overruns %v, running-task overruns %d",
		st.Requests, st.Admitted, ts.PeakRunning, taskRunning, st.RateLimited, st.Overruns, ts.Overruns)
	requireNoOverruns(t, "wanx2.1-t2i-turbo", st)
	require.Zero(t, ts.Overruns)
	require.EqualValues(t, taskJobs, ts.Submitted, "one submission per job")
	require.LessOrEqual(t, ts.PeakRunning, int64(taskRunning))
	var ok int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = 'succeeded' AND kind = 'task'
		AND task_id IS NOT NULL AND response->'output'->>'task_id' = task_id AND response->'output'->>'task_status' = 'SUCCEEDED'`).Scan(&ok))
	require.Equal(t, taskJobs, ok)
}

// TestTaskConsumerKilledMidTask: `consumer run` is killed with SIGKILL
// while an image task it submitted is running; the next consumer finds the
// task id in the job's row and polls that task to completion: llmsim saw
// exactly one submission.
func TestTaskConsumerKilledMidTask(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills a consumer: not in -short")
	}
	ctx := context.Background()
	bin := buildCmd(t, "consumer")
	pgURL := testsvc.PostgresURL(t)
	amqpURL := testVhost(t, testsvc.AMQPURL(t))
	s := startSim(t, sim.Config{APIKeys: []string{"sk-task-kill"}, Models: map[string]sim.ModelConfig{
		"wanx2.1-t2i-turbo": {Kind: sim.KindTask, MaxRunningTasks: 2, TaskDuration: sim.Duration(8 * time.Second)},
	}})
	cfgPath := filepath.Join(t.TempDir(), "consumer.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(`
broker: rabbitmq
metrics_addr: 127.0.0.1:0
provider: {timeout: 10s}
worker: {lease: 3s, retry_base: 50ms, retry_max: 500ms, shutdown_grace: 5s, task_poll_interval: 200ms}
models:
  wanx2.1-t2i-turbo: {kind: task, rpm: 60, max_concurrency: 2}
`), 0o600))
	env := append(os.Environ(), "LLMQ_CONFIG="+cfgPath, "LLMQ_POSTGRES_URL="+pgURL, "LLMQ_AMQP_URL="+amqpURL,
		"LLMQ_PROVIDER_BASE_URL="+s.url+"/v1", "LLMQ_PROVIDER_API_KEY=sk-task-kill")

	pub, err := rabbitmq.NewPublisher(ctx, rabbitmq.Config{URL: amqpURL})
	require.NoError(t, err)
	body := `{"id":"img-kill","model":"wanx2.1-t2i-turbo","kind":"task","request":{"input":{"prompt":"a cat"}}}`
	require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: "img-kill", Body: []byte(body)}))
	require.NoError(t, pub.Close())
	pool, err := pgxpool.New(ctx, pgURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	row := func() (status, taskID string) {
		var tid *string
		err := pool.QueryRow(ctx, `SELECT status, task_id FROM jobs WHERE id = 'img-kill'`).Scan(&status, &tid)
		if err != nil {
			return "", ""
		}
		if tid != nil {
			taskID = *tid
		}
		return status, taskID
	}

	first := startProc(t, bin, append(env, "LLMQ_WORKER_ID=task-first"), "run")
	waitUntil(t, time.Minute, first, func() bool { _, id := row(); return id != "" })
	require.NoError(t, first.cmd.Process.Kill()) // SIGKILL while the task runs
	<-first.done
	status, taskID := row()
	require.Equal(t, "running", status, "killed mid-task")
	require.EqualValues(t, 1, s.sim.TaskStats("wanx2.1-t2i-turbo").Submitted)

	second := startProc(t, bin, append(env, "LLMQ_WORKER_ID=task-second"), "run")
	waitUntil(t, 2*time.Minute, second, func() bool { st, _ := row(); return st == "succeeded" })
	var resp string
	require.NoError(t, pool.QueryRow(ctx, `SELECT response->'output'->>'task_id' FROM jobs WHERE id = 'img-kill'`).Scan(&resp))
	require.Equal(t, taskID, resp, "the result is the first consumer's task")
	ts := s.sim.TaskStats("wanx2.1-t2i-turbo")
	t.Logf("task %s: %d submission(s) in all; the second consumer polled it to completion", taskID, ts.Submitted)
	require.EqualValues(t, 1, ts.Submitted, "polled to completion, not submitted again")
	require.Contains(t, second.out.String(), "resuming a submitted task")
}

// waitUntil polls cond until it holds, failing after within or when p exits.
func waitUntil(t *testing.T, within time.Duration, p *proc, cond func() bool) {
	t.Helper()
	deadline := time.After(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-p.done:
			t.Fatalf("%s exited: %v\n%s", p.name, p.err, p.out.tail(30))
		case <-deadline:
			t.Fatalf("condition not met within %s\n%s", within, p.out.tail(30))
		}
	}
}
