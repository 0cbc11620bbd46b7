package bench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/testsvc"
)

// The offload comparison: all online nothing goes through a batch; with
// offload every low-lane job does, for less, and the high lane still runs
// online.
func TestOffloadBench(t *testing.T) {
	sc := OffloadScenario{HighJobs: 5, LowJobs: 30, BatchDelay: 200 * time.Millisecond, MaxJobs: 20,
		Price: DefaultOffloadScenario().Price, Discount: 0.5, Timeout: time.Minute}
	res, err := RunOffload(context.Background(), Env{PostgresURL: testsvc.PostgresEmptyURL(t)}, sc)
	require.NoError(t, err)
	require.Len(t, res, 2)
	online, off := res[0], res[1]
	lane := func(r OffloadResult, p job.Priority) OffloadLane {
		for _, l := range r.Lanes {
			if l.Lane == p {
				return l
			}
		}
		t.Fatalf("%s: no %s lane", r.Mode, p)
		return OffloadLane{}
	}
	require.Zero(t, online.Batches)
	require.Equal(t, int64(35), online.OnlineCalls)
	require.Equal(t, 30, lane(off, job.PriorityLow).ViaBatch)
	require.Equal(t, 30, lane(off, job.PriorityLow).Succeeded)
	require.Equal(t, 5, lane(off, job.PriorityHigh).Succeeded)
	require.Zero(t, lane(off, job.PriorityHigh).ViaBatch)
	require.Equal(t, 2, off.Batches, "30 jobs in batches of 20")
	require.InDelta(t, lane(online, job.PriorityLow).Cost/2, lane(off, job.PriorityLow).Cost, 1e-9, "the low lane at half price")
	var out bytes.Buffer
	PrintOffload(&out, sc, res)
	require.Contains(t, out.String(), "offload: all done")
}
