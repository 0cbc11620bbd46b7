package ingest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// A job that passes validation but that Postgres will not store (here a
// metadata value nested deeper than the server's stack allows) is refused
// under its id with Postgres's reason; the jobs batched with it are
// stored and forwarded, and the jobs after it go through.
func TestIngestRefusesAJobPostgresWillNotStore(t *testing.T) {
	t.Parallel()
	r := newRigOn(t, ingest.Config{}, store.New(testsvc.PostgresSmallStack(t)))
	deep := fmt.Sprintf(`{"id":"deep","model":"qwen-plus","metadata":{"tree":%s},"request":{"messages":[{"role":"user","content":"a"}]}}`,
		testsvc.DeepJSON(testsvc.SmallStackDepth))
	for i := range 20 {
		r.publish(job.PriorityNormal, job1(fmt.Sprintf("before-%d", i), `"hi"`))
	}
	r.publish(job.PriorityNormal, deep)
	for i := range 20 {
		r.publish(job.PriorityNormal, job1(fmt.Sprintf("after-%d", i), `"hi"`))
	}
	got := r.forwarded(job.PriorityNormal, 40)
	assert.Len(t, got, 40)
	for _, id := range []string{"before-0", "before-19", "after-0", "after-19"} {
		assert.Equal(t, job.StatusQueued, r.waitRow(job.DefaultTenant, id).Status, id)
	}

	rec := r.waitRow(job.DefaultTenant, "deep")
	require.Equal(t, job.StatusFailed, rec.Status)
	require.Len(t, rec.Errors, 1)
	assert.Equal(t, "invalid", rec.Errors[0].Kind)
	assert.Contains(t, rec.Errors[0].Message, "Postgres cannot store this job: stack depth limit exceeded (SQLSTATE 54001)")
	dls, _, err := r.store.ListDeadLetters(context.Background(), job.DefaultTenant, "", 10)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	assert.Equal(t, "deep", dls[0].JobID)
	assert.Equal(t, store.DeadLetterJob, dls[0].Kind)
	assert.Equal(t, deep, string(dls[0].Body), "the message kept byte for byte")
	r.noneForwarded(job.PriorityNormal)
}
