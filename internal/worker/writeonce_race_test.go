package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/store"
)

// slowProbe is the ingester's store with its first write-once probe slow
// to answer: it reads the rows at once, as the query's snapshot would, and
// answers only once release is closed or a second has passed.
type slowProbe struct {
	ingest.Store
	probing chan struct{} // closed when the first probe has read
	release <-chan struct{}
	once    sync.Once
}

func (s *slowProbe) Absent(ctx context.Context, jobs []job.Job) ([]bool, error) {
	got, err := s.Store.Absent(ctx, jobs)
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.probing)
		select {
		case <-s.release:
		case <-time.After(time.Second):
		}
	}
	return got, err
}

// Two messages of one job read into two batches flushed side by side run
// the job once: the second batch waits for the first to decide on the key,
// then finds the job running here and judges its message a duplicate.
// Without that, both probes found no row and both messages ran.
func TestWriteOnceRunsAJobReadTwiceInTwoBatchesOnce(t *testing.T) {
	t.Parallel()
	called := make(chan struct{})
	var calledOnce sync.Once
	probe := &slowProbe{probing: make(chan struct{}), release: called}
	r := newWriteOnceRigWith(t, func(inner Provider) Provider {
		return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
			calledOnce.Do(func() { close(called) })
			return inner.Chat(ctx, model, request)
		})
	}, func(s ingest.Store) ingest.Store { probe.Store = s; return probe })
	r.publish(t, "twice")
	select {
	case <-probe.probing:
	case <-time.After(time.Minute):
		t.Fatal("the first message was never probed for write-once")
	}
	r.publish(t, "twice") // read into a second batch while the first probes
	assert.Equal(t, map[string]int{"succeeded": 1}, r.h.wait(1, time.Minute))
	require.Eventually(t, func() bool {
		return counted(t, r.ireg, "llmq_ingest_messages_total", "outcome", "duplicate") == 1
	}, time.Minute, time.Millisecond, "the second message judged a duplicate")
	r.stop()
	assert.Equal(t, int32(1), r.calls.Load(), "called once")
	assert.Equal(t, 1, r.count(t, "id = 'twice'"))
}

// A job that runs unwritten while another job is stored under its id (by
// the API, say) leaves that job alone and its own message is recorded as
// a conflict, as the ingester records one: acked, not lost. Both ways its
// row can be written: finished within the delay, claimed after it.
func TestWriteOnceRecordsAConflictWithAJobStoredMeanwhile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		hold time.Duration // how long the call waits once the other job is stored
	}{{"finished", 0}, {"claimed at the delay", 400 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			release, entered := make(chan struct{}), make(chan struct{}, 1)
			r := newWriteOnceRig(t, func(inner Provider) Provider {
				return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
					entered <- struct{}{}
					<-release
					time.Sleep(tc.hold)
					return inner.Chat(ctx, model, request)
				})
			})
			r.publish(t, "reused")
			<-entered
			other := job.Job{Tenant: job.DefaultTenant, ID: "reused", Model: "m",
				Request: []byte(`{"messages": [{"role": "user", "content": "another job"}]}`)}
			_, created, err := r.h.store.Insert(context.Background(), other)
			require.NoError(t, err)
			require.True(t, created, "the row did not exist while the job ran unwritten")
			close(release)
			require.Eventually(t, func() bool {
				return r.countDeadLetters(t, "job_id = 'reused' AND reason = '"+store.ReasonConflict+"'") == 1
			}, time.Minute, 5*time.Millisecond, "the message recorded as a conflict")
			r.stop()
			assert.Equal(t, 1, r.count(t, "id = 'reused' AND request->'messages'->0->>'content' = 'another job'"),
				"the stored job is untouched")
			assert.Equal(t, int64(0), r.queued(t), "the intake message was acked")
		})
	}
}

// A job that runs unwritten while the same job is stored under its id (the
// API took a second submission of it) acks its message as a duplicate,
// and pins the stored job as it reads it: should the API's publish of that
// submission fail, its take-back keeps the job this message was answered
// with (store.Unsubmit).
func TestWriteOnceDuplicatePinsTheStoredJob(t *testing.T) {
	t.Parallel()
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	r := newWriteOnceRig(t, func(inner Provider) Provider {
		return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
			entered <- struct{}{}
			<-release
			return inner.Chat(ctx, model, request)
		})
	})
	r.publish(t, "same")
	<-entered
	same, err := job.ParseQueued(jobBody("same", "m", 0, nil), job.PriorityNormal, job.Limits{})
	require.NoError(t, err)
	_, created, err := r.h.store.Insert(context.Background(), same)
	require.NoError(t, err)
	require.True(t, created, "the row did not exist while the job ran unwritten")
	close(release)
	require.Eventually(t, func() bool { return r.queued(t) == 0 }, time.Minute, 5*time.Millisecond, "the message was acked")
	r.stop()
	kept, err := r.h.store.Unsubmit(context.Background(), []job.Key{same.Key()})
	require.NoError(t, err)
	assert.Equal(t, []job.Key{same.Key()}, kept, "the job the message was acked against stays")
	assert.Zero(t, r.countDeadLetters(t, "job_id = 'same'"), "a duplicate, not a conflict")
}
