package integration

import (
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/sim"
)

// TestFaultKafkaRebalance promises that a Kafka consumer-group rebalance in
// the middle of a batch skips no offset and stores no result twice: one
// `consumer run` starts on the Kafka protocol (testsvc: kfake unless
// LLMQ_TEST_KAFKA_BROKERS is set), a second joins once a quarter of the
// jobs are done (partitions move while messages are in flight), and the
// first is killed with SIGKILL at half (its uncommitted offsets are
// redelivered to the second after the session timeout). Every job ends
// succeeded with exactly one result write; redeliveries of finished jobs
// are absorbed by the store's claim.
func TestFaultKafkaRebalance(t *testing.T) {
	const n = 300
	s := newFaultStack(t, faultOptions{
		Broker: "kafka",
		Sim:    sim.Config{Latency: sim.LatencyConfig{TTFT: sim.Duration(40 * time.Millisecond)}},
		// Slow enough that the run spans the join and the kill.
		Model: "{max_concurrency: 3}",
	})
	bodies := map[string][]byte{}
	want := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("kafka-%04d", i)
		bodies[id] = faultJob(id, "")
		want[id] = "succeeded"
	}
	first := s.consumer("kafka-first")
	// Publish once the consumer has created the topics and joined.
	first.waitFor(t, regexp.MustCompile(`"msg":"(worker started)"`))
	s.publish(bodies)

	s.waitFor("a quarter of the jobs", func() bool { return s.countWhere(`status = 'succeeded'`) >= n/4 }, first)
	second := s.consumer("kafka-second") // joins: the group rebalances mid-batch
	s.waitFor("half of the jobs", func() bool { return s.countWhere(`status = 'succeeded'`) >= n/2 }, first, second)
	done := s.countWhere(`status = 'succeeded'`)
	require.Less(t, done, n, "the kill must come mid-run")
	require.NoError(t, first.cmd.Process.Kill()) // leaves the group without a goodbye
	<-first.done

	s.waitTerminal(n, second)
	s.stopAll(second)
	l := s.settle("Kafka rebalance: consumer added at 25%, another SIGKILLed at 50%", want, "all succeeded, redeliveries absorbed")
	require.Zero(t, l.Lost)
	require.Zero(t, l.DuplicateResults)
	redelivered := 0
	for id := range want {
		if s.callsFor(id) > 1 {
			redelivered++
		}
	}
	t.Logf("killed the first consumer with %d of %d jobs done; %d jobs were called more than once; %d provider calls", done, n, redelivered, l.Calls)
}
