package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/store"
)

func (s *notifyStore) MarkBatched(ctx context.Context, a store.Attempt) (bool, error) {
	ok, err := s.Store.MarkBatched(ctx, a)
	if ok {
		s.emit("batched", 1)
	}
	return ok, err
}

// Low-lane jobs of a batch-enabled model are batched (no call) and their
// deliveries acked; high-lane jobs, low-lane jobs whose deadline is nearer
// than the window plus margin, and jobs a batch already sent back run
// online.
func TestOffloadRoutesByLaneAndDeadline(t *testing.T) {
	t.Parallel()
	models := map[string]config.Model{"qwen-plus": {Batch: config.Batch{Enabled: true, Lanes: []string{"low"},
		CompletionWindow: time.Hour, Margin: 10 * time.Minute}}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"qwen-plus": {}}}, models)
	mem := memory.New(memory.Config{})
	ctx := context.Background()
	soon := time.Now().Add(30 * time.Minute)
	later := time.Now().Add(3 * time.Hour)
	var jobs []job.Job
	add := func(prefix string, n int, lane job.Priority, deadline *time.Time) {
		for i := range n {
			jobs = append(jobs, job.Job{ID: fmt.Sprintf("%s-%d", prefix, i), Model: "qwen-plus", Priority: lane, Deadline: deadline,
				Request: []byte(fmt.Sprintf(`{"messages":[{"role":"user","content":"%s %d"}],"max_tokens":8}`, prefix, i))})
		}
	}
	add("low", 20, job.PriorityLow, nil)
	add("low-later", 5, job.PriorityLow, &later)
	add("low-soon", 5, job.PriorityLow, &soon)
	add("high", 10, job.PriorityHigh, nil)
	add("sent-back", 3, job.PriorityLow, nil)
	for i := range jobs {
		jobs[i].Normalize()
	}
	_, err := h.store.InsertBatch(ctx, jobs)
	require.NoError(t, err)
	for _, j := range jobs[len(jobs)-3:] {
		// As if a batch had sent them back online already.
		_, err := h.pool.Exec(ctx, `UPDATE jobs SET errors = '[{"attempt":1,"kind":"batch","message":"line failed","at":"2026-01-01T00:00:00Z"}]'
			WHERE tenant = $1 AND id = $2`, j.Tenant, j.ID)
		require.NoError(t, err)
	}
	for _, j := range jobs {
		require.NoError(t, mem.Publisher().Publish(ctx, j.Priority, broker.WakeUp(j.Key(), j.Model)))
	}
	_, stop := h.start(mem.Subscriber(), h.cfg)
	got := h.wait(len(jobs), time.Minute)
	stop()
	require.Equal(t, map[string]int{"batched": 25, "succeeded": 18}, got)
	for _, j := range jobs {
		rec, err := h.store.Get(ctx, j.Key())
		require.NoError(t, err)
		want := job.StatusSucceeded
		if j.Priority == job.PriorityLow && (j.Deadline == nil || j.Deadline.Equal(later)) && len(rec.Errors) == 0 {
			want = job.StatusBatched
		}
		require.Equal(t, want, rec.Status, j.ID)
	}
	require.Equal(t, 18, int(h.sim.Stats().Models["qwen-plus"].Requests), "batched jobs make no call")
}
