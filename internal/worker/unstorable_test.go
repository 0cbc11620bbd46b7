package worker

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/testsvc"
)

// smallStack has the rig's Postgres refuse JSON nested
// testsvc.SmallStackDepth deep, which validation and providers' answers
// may hold.
var smallStack = testsvc.SmallStack

const deepTree = `"tree":` // the field a test's deep value is under

// deepAnswers answers the jobs whose request names one of ids with a body
// Postgres (under smallStack) will not store.
func deepAnswers(ids ...string) func(Provider) Provider {
	return func(p Provider) Provider {
		return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
			resp, err := p.Chat(ctx, model, request)
			for _, id := range ids {
				if err == nil && strings.Contains(string(request), "ticket "+id) {
					r := *resp
					r.Body = []byte(`{"choices":[{"message":{"role":"assistant","content":"x"}}],` + deepTree + testsvc.DeepJSON(testsvc.SmallStackDepth) + `}`)
					return &r, nil
				}
			}
			return resp, err
		})
	}
}

// A provider answer Postgres will not store fails its job with the reason;
// the jobs written in the same statement are stored, and nothing is called
// twice: before, the statement failed at every try and every job of it ran
// again.
func TestAnAnswerPostgresWillNotStoreFailsOnlyItsJob(t *testing.T) {
	t.Parallel()
	const n = 12
	r := newWriteOnceRigWith(t, deepAnswers("deep-answer"), nil, smallStack)
	ids := []string{"deep-answer"}
	for i := range n - 1 {
		ids = append(ids, fmt.Sprintf("fine-%d", i))
	}
	r.publish(t, ids...)
	assert.Equal(t, map[string]int{"succeeded": n - 1, "failed": 1}, r.h.wait(n, time.Minute))
	rec, err := r.h.store.Get(context.Background(), job.Key{Tenant: job.DefaultTenant, ID: "deep-answer"})
	require.NoError(t, err)
	require.Equal(t, job.StatusFailed, rec.Status)
	require.NotEmpty(t, rec.Errors)
	last := rec.Errors[len(rec.Errors)-1]
	assert.Equal(t, "unstorable", last.Kind)
	assert.Contains(t, last.Message, "Postgres cannot store the provider's answer: stack depth limit exceeded (SQLSTATE 54001)")
	assert.Equal(t, n-1, r.count(t, `status = 'succeeded'`))
	var calls, failed int
	require.NoError(t, r.h.pool.QueryRow(context.Background(), `SELECT sum(calls), sum(failed) FROM usage_hours`).Scan(&calls, &failed))
	assert.Equal(t, []int{n, 1}, []int{calls, failed}, "the refused answer's call counted, as a failed one")
	r.stop()
	assert.Equal(t, int32(n), r.calls.Load(), "each job called once")
	assert.Zero(t, r.queued(t), "every intake message settled")
}

// A job whose values pass validation but that Postgres will not store,
// taken write-once (its row not written before its call), is refused as
// at intake when its row is written: failed under its id with the reason,
// its message kept as its dead letter. The other jobs of the statement are
// stored.
func TestAJobPostgresWillNotStoreTakenWriteOnceIsRefused(t *testing.T) {
	t.Parallel()
	const n = 12
	r := newWriteOnceRigWith(t, nil, nil, smallStack)
	deep := fmt.Sprintf(`{"id":"deep-meta","model":"m","metadata":{%s%s},"request":{"messages":[{"role":"user","content":"a"}],"max_tokens":8}}`,
		deepTree, testsvc.DeepJSON(testsvc.SmallStackDepth))
	require.NoError(t, r.pub.PublishIntake(context.Background(), job.PriorityNormal, broker.Message{Key: "deep-meta", Body: []byte(deep)}))
	var ids []string
	for i := range n - 1 {
		ids = append(ids, fmt.Sprintf("fine-%d", i))
	}
	r.publish(t, ids...)
	r.h.wait(n-1, time.Minute)
	require.Eventually(t, func() bool {
		return r.count(t, `id = 'deep-meta' AND status = 'failed'`) == 1
	}, time.Minute, 10*time.Millisecond, "the job refused under its id")
	rec, err := r.h.store.Get(context.Background(), job.Key{Tenant: job.DefaultTenant, ID: "deep-meta"})
	require.NoError(t, err)
	require.Len(t, rec.Errors, 1)
	assert.Equal(t, "invalid", rec.Errors[0].Kind)
	assert.Contains(t, rec.Errors[0].Message, "Postgres cannot store this job: stack depth limit exceeded (SQLSTATE 54001)")
	assert.Equal(t, 1, r.countDeadLetters(t, `job_id = 'deep-meta' AND body = convert_to(`+quote(deep)+`, 'UTF8')`), "its message kept")
	assert.Equal(t, n-1, r.count(t, `status = 'succeeded'`))
	r.stop()
	assert.LessOrEqual(t, r.calls.Load(), int32(n), "no job called twice")
	assert.Zero(t, r.queued(t), "every intake message settled")
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// A parked batch whose settle Postgres refuses for one answer is settled
// with its jobs claimed instead, and their results stored one by one: the
// answer's job fails with the reason, the others succeed, and none is
// called twice (before, the batch stayed parked and ran again).
func TestAnAnswerPostgresWillNotStoreInAParkedBatch(t *testing.T) {
	t.Parallel()
	const n = 40
	var calls atomic.Int32
	h := parkedRig(t, n, func(p Provider) Provider {
		deep := deepAnswers(`7"`)(p) // the job of "ticket 7"
		return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
			calls.Add(1)
			return deep.Chat(ctx, model, request)
		})
	}, smallStack)
	_, stop := startParked(h, nil)
	assert.Equal(t, map[string]int{"succeeded": n - 1, "failed": 1}, h.wait(n, time.Minute))
	stop()
	rec, err := h.store.Get(context.Background(), job.Key{Tenant: "flood", ID: "p-007"})
	require.NoError(t, err)
	require.Equal(t, job.StatusFailed, rec.Status)
	assert.Equal(t, "unstorable", rec.Errors[len(rec.Errors)-1].Kind)
	assert.Equal(t, n-1, rowsWhere(t, h, `status = 'succeeded' AND attempts = 1`))
	assert.Equal(t, int32(n), calls.Load(), "each job called once")
}
