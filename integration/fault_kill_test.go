package integration

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/worker"
)

// TestFaultKillAtFailpoints promises that a consumer killed with SIGKILL
// in the two windows a signal from outside cannot aim at — after the
// provider answered but before the result is stored, and after the result
// is stored but before the message is acked — loses no job: a second
// consumer finishes every job, each job's result is written exactly once,
// and the provider sees each job at most attempts + 1 times. The first
// consumer kills itself through the test-only LLMQ_FAILPOINT hook
// (internal/worker/failpoint.go).
func TestFaultKillAtFailpoints(t *testing.T) {
	for _, tc := range []struct {
		point string
		nth   int
	}{
		{worker.FailpointAfterProviderCall, 25},
		{worker.FailpointAfterResultWrite, 3},
	} {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			const n = 160
			s := newFaultStack(t, faultOptions{Sim: sim.Config{
				Latency: sim.LatencyConfig{TTFT: sim.Duration(10 * time.Millisecond)},
			}})
			want := map[string]string{}
			bodies := map[string][]byte{}
			for i := range n {
				id := fmt.Sprintf("fp-%04d", i)
				bodies[id] = faultJob(id, "")
				want[id] = "succeeded"
			}
			s.publish(bodies)

			first := s.consumer("fp-first", fmt.Sprintf("LLMQ_FAILPOINT=%s:%d", tc.point, tc.nth))
			s.waitFor("the first consumer to kill itself at "+tc.point, func() bool {
				select {
				case <-first.done:
					return true
				default:
					require.Less(t, s.countWhere(`status = 'succeeded'`), n, "the failpoint never fired:\n%s", first.out.tail(20))
					return false
				}
			})
			ws, ok := first.cmd.ProcessState.Sys().(syscall.WaitStatus)
			require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL,
				"the first consumer must die of SIGKILL, got %v\n%s", first.err, first.out.tail(20))
			require.Contains(t, first.out.String(), `"failpoint":"`+tc.point+`"`)
			before := s.countWhere(`status = 'succeeded'`)
			require.Less(t, before, n, "the kill must come mid-run")

			second := s.consumer("fp-second")
			s.waitTerminal(n, second)
			s.stopAll(second)

			l := s.settle("kill -9 at "+tc.point, want, "all succeeded after restart")
			require.Zero(t, l.Lost)
			require.Zero(t, l.DuplicateResults)
			retried := 0
			for id := range want {
				if s.callsFor(id) > 1 {
					retried++
				}
			}
			t.Logf("killed at %s pass %d with %d jobs done; %d jobs were called twice (the cut calls), none stored twice", tc.point, tc.nth, before, retried)
			if tc.point == worker.FailpointAfterProviderCall {
				require.Positive(t, retried, "the call cut before its result write is made again")
			}
			require.NotContains(t, first.out.String()+second.out.String(), faultProviderKey)
		})
	}
}
