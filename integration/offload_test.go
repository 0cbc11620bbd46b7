package integration

import (
	"context"
	"fmt"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/sim"
)

// Batch offload end to end (docs/design.md#batch-offload): `consumer run`
// subprocesses on real Postgres and RabbitMQ or Kafka, llmsim serving the
// Batch API in process. The call counter of the fault stack counts online
// chat calls only, so a job that went through a batch has none.

// offloadModel is qwen-plus with batch offload on the low lane, scaled to
// seconds: a 2 s completion window and a 1 s margin.
const offloadModel = `{batch: {enabled: true, lanes: [low], max_jobs: 50, gather: 300ms, completion_window: 2s, margin: 1s, poll_interval: 100ms}}`

// publishLanes puts each job on the intake of its lane.
func (s *faultStack) publishLanes(lanes map[string]job.Priority, bodies map[string][]byte) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := s.publisher(ctx)
	defer pub.Close()
	for id, body := range bodies {
		require.NoError(s.t, pub.PublishIntake(ctx, lanes[id], broker.Message{Key: id, Body: body}))
	}
}

// offloadJobs builds n jobs of lane named prefix-i, with a deadline when dl is set.
func offloadJobs(prefix string, n int, lane job.Priority, dl *time.Time, lanes map[string]job.Priority, bodies map[string][]byte) {
	for i := range n {
		id := fmt.Sprintf("%s-%04d", prefix, i)
		extra := `,"priority":"` + string(lane) + `"`
		if dl != nil {
			extra += `,"deadline":"` + dl.UTC().Format(time.RFC3339Nano) + `"`
		}
		bodies[id], lanes[id] = faultJob(id, extra), lane
	}
}

// allSucceeded expects every job of bodies to succeed.
func allSucceeded(bodies map[string][]byte) map[string]string {
	want := map[string]string{}
	for id := range bodies {
		want[id] = "succeeded"
	}
	return want
}

// runAllSucceed publishes the jobs, runs one consumer until all are
// terminal and requires each to have succeeded with its result stored once.
func (s *faultStack) runAllSucceed(lanes map[string]job.Priority, bodies map[string][]byte, scenario, outcome string) {
	s.t.Helper()
	want := allSucceeded(bodies)
	s.publishLanes(lanes, bodies)
	c := s.consumer("offload-1")
	s.waitTerminal(len(want), c)
	s.stopAll(c)
	l := s.settle(scenario, want, outcome)
	require.Zero(s.t, l.Lost)
	require.Zero(s.t, l.DuplicateResults)
}

func (s *faultStack) batchRows() int {
	var n int
	require.NoError(s.t, s.pool.QueryRow(context.Background(), `SELECT count(*) FROM batches`).Scan(&n))
	return n
}

// TestOffloadLowLaneThroughBatches promises that a low-lane backlog of a
// batch-enabled model goes through provider batches (no online call, one
// upload and one batch per batch) while the high lane's jobs run online;
// the lines a batch fails run online; every job's result is stored once.
func TestOffloadLowLaneThroughBatches(t *testing.T) {
	for _, brk := range []string{"rabbitmq", "kafka"} {
		t.Run(brk, func(t *testing.T) {
			t.Parallel()
			s := newFaultStack(t, faultOptions{Broker: brk, Model: offloadModel, Sim: sim.Config{
				Latency: sim.LatencyConfig{TTFT: sim.Duration(5 * time.Millisecond)},
				Batch:   sim.BatchConfig{Delay: sim.Duration(500 * time.Millisecond), FailFraction: 0.1},
			}})
			lanes, bodies := map[string]job.Priority{}, map[string][]byte{}
			offloadJobs("low", 200, job.PriorityLow, nil, lanes, bodies)
			offloadJobs("high", 40, job.PriorityHigh, nil, lanes, bodies)
			s.runAllSucceed(lanes, bodies, "offload over "+brk, "low lane through batches, high lane online")

			viaBatch, online := 0, 0
			for id, lane := range lanes {
				switch {
				case lane == job.PriorityHigh:
					require.Equal(t, 1, s.callsFor(id), "high-lane job %s runs online once", id)
				case s.callsFor(id) == 0:
					viaBatch++
				default:
					online++
				}
			}
			require.Equal(t, online, s.countWhere(`id LIKE 'low-%' AND errors @> '[{"kind":"batch"}]'`),
				"a low job ran online only after its batch line failed")
			require.Positive(t, online, "fail_fraction 0.1 fails some lines")
			require.Greater(t, viaBatch, 150)
			st := s.sim.BatchStats()
			require.Equal(t, s.batchRows(), st.Uploads, "one upload per batch")
			require.Equal(t, s.batchRows(), st.Batches, "one provider batch per batch")
			require.GreaterOrEqual(t, st.Batches, 4, "200 jobs at max_jobs 50")
			t.Logf("OFFLOAD | %s | %d low jobs via %d batches, %d online after a failed line; %d high jobs online",
				brk, viaBatch, st.Batches, online, 40)
		})
	}
}

// TestOffloadExpiredBatchFinishesOnline promises that the jobs of a batch
// that expires run online and finish before their deadlines.
func TestOffloadExpiredBatchFinishesOnline(t *testing.T) {
	for _, brk := range []string{"rabbitmq", "kafka"} {
		t.Run(brk, func(t *testing.T) {
			t.Parallel()
			expiredBatchFinishesOnline(t, brk)
		})
	}
}

func expiredBatchFinishesOnline(t *testing.T, brk string) {
	s := newFaultStack(t, faultOptions{Broker: brk, Model: offloadModel, Sim: sim.Config{Batch: sim.BatchConfig{Expire: true}}})
	dl := time.Now().Add(30 * time.Second)
	lanes, bodies := map[string]job.Priority{}, map[string][]byte{}
	offloadJobs("exp", 60, job.PriorityLow, &dl, lanes, bodies)
	s.runAllSucceed(lanes, bodies, "offload: batch expired over "+brk, "every job finished online before its deadline")
	require.Positive(t, s.sim.BatchStats().Expired)
	require.Equal(t, 60, s.countWhere(`completed_at < deadline AND errors @> '[{"kind":"batch","code":"batch_expired"}]'`),
		"each job went through the expired batch and finished before its deadline")
	for id := range bodies {
		require.Equal(t, 1, s.callsFor(id), "job %s ran online once", id)
	}
}

// TestOffloadKillAtFailpoints promises that a consumer killed with SIGKILL
// after an upload was answered (before its file id is recorded), after a
// batch was created (before its id is recorded) and after part of an
// output file's results were stored leaves nothing duplicated: the next
// consumer resumes the same batch, the provider sees one upload and one
// batch per batch, and every job's result is stored once.
func TestOffloadKillAtFailpoints(t *testing.T) {
	type kill struct{ point, broker string }
	kills := []kill{{offload.FailpointDownload, "kafka"}}
	for _, p := range offload.Failpoints {
		kills = append(kills, kill{p, "rabbitmq"})
	}
	for _, k := range kills {
		point := k.point
		t.Run(point+"/"+k.broker, func(t *testing.T) {
			t.Parallel()
			s := newFaultStack(t, faultOptions{Broker: k.broker, Model: offloadModel, Sim: sim.Config{
				Batch: sim.BatchConfig{Delay: sim.Duration(300 * time.Millisecond), FailFraction: 0.1},
			}})
			lanes, bodies := map[string]job.Priority{}, map[string][]byte{}
			offloadJobs("k", 120, job.PriorityLow, nil, lanes, bodies)
			want := allSucceeded(bodies)
			s.publishLanes(lanes, bodies)
			first := s.consumer("offload-first", "LLMQ_FAILPOINT="+point)
			s.waitFor("the first consumer to kill itself at "+point, func() bool {
				select {
				case <-first.done:
					return true
				default:
					return false
				}
			})
			ws, ok := first.cmd.ProcessState.Sys().(syscall.WaitStatus)
			require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL,
				"the first consumer must die of SIGKILL, got %v\n%s", first.err, first.out.tail(20))
			require.Contains(t, first.out.String(), `"failpoint":"`+point+`"`)
			before := s.sim.BatchStats()

			second := s.consumer("offload-second")
			s.waitTerminal(len(want), second)
			s.stopAll(second)
			l := s.settle("offload: kill -9 at "+point+" over "+k.broker, want, "resumed, nothing uploaded or submitted twice")
			require.Zero(t, l.Lost)
			require.Zero(t, l.DuplicateResults)
			st := s.sim.BatchStats()
			require.Equal(t, s.batchRows(), st.Uploads, "one upload per batch (before the kill: %+v)", before)
			require.Equal(t, s.batchRows(), st.Batches, "one provider batch per batch (before the kill: %+v)", before)
			require.Positive(t, before.Uploads, "the kill came after an upload")
			// The second consumer found what the first did not record.
			resumed := map[string]string{
				offload.FailpointUpload:   `"msg":"batch uploaded"[^\n]*"again":true`,
				offload.FailpointSubmit:   `"msg":"batch submitted"[^\n]*"again":true`,
				offload.FailpointDownload: `"msg":"batch file settled"[^\n]*"results":[1-9][0-9]*,"stored":0`,
			}[point]
			require.Regexp(t, regexp.MustCompile(resumed), second.out.String(), "the second consumer resumed the batch")
		})
	}
}
