package kafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
)

// The reconciler drains the dead-letter topic only while it leads. A
// replica that loses the lead keeps its Inspector open (for Depth); its
// dead-letter reader used to stay in the group with its share of the
// partitions, which the next leader then never read. A drain ended by
// the cancellation of its context now leaves the group.
func TestAFormerLeaderLeavesTheDeadLetterGroup(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	old, next := newInspector(t, cfg), newInspector(t, cfg)

	publish := deadLetterPublisher(t, ctx, cfg)

	// The old leader's drain loop, as the reconciler runs it, until it
	// loses the lead.
	lead, lose := context.WithCancel(ctx)
	drained := make(chan string, 10)
	loopDone := make(chan error, 1)
	calls := make(chan struct{}, 10) // one per drain the loop starts
	go func() {
		for {
			calls <- struct{}{}
			err := old.DrainDeadLetters(lead, 10, func(dls []broker.DeadLetter) error {
				for _, dl := range dls {
					drained <- dl.Key
				}
				return nil
			})
			if lead.Err() != nil {
				loopDone <- err
				return
			}
		}
	}()
	publish("first", 1)
	select {
	case k := <-drained:
		assert.Equal(t, "first-0", k)
	case <-time.After(time.Minute):
		t.Fatal("the old leader drained nothing")
	}
	// The lead is lost during the loop's next drain, not between two
	// drains (StopDraining's case, the next test): lost while the first
	// drain was returning, the loop ended with that drain's nil.
	<-calls
	<-calls
	lose()
	require.True(t, errors.Is(<-loopDone, context.Canceled))

	assertNextLeaderReadsAll(t, ctx, next, publish)
}

// The reconciler's drain loop can also end between two drains (the lead
// lost while it waited to retry a failed record); it then calls
// StopDraining, which leaves the group too.
func TestStopDrainingLeavesTheDeadLetterGroup(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	old, next := newInspector(t, cfg), newInspector(t, cfg)
	publish := deadLetterPublisher(t, ctx, cfg)
	publish("first", 1)
	dls, err := old.ReadDeadLetters(ctx, 10) // joins the group, and returns
	require.NoError(t, err)
	require.Len(t, dls, 1)
	old.StopDraining()
	assertNextLeaderReadsAll(t, ctx, next, publish)
}

func assertNextLeaderReadsAll(t *testing.T, ctx context.Context, next *kafka.Inspector, publish func(string, int)) {
	t.Helper()
	publish("second", 30)
	seen := map[string]bool{}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && len(seen) < 30 {
		dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
		dls, _ := next.ReadDeadLetters(dctx, 100)
		dcancel()
		for _, dl := range dls {
			seen[dl.Key] = true
		}
	}
	assert.Len(t, seen, 30, "the new leader reads every dead letter published after the lead changed")
}

// deadLetterPublisher writes dead letters prefix-0 … prefix-(n-1) to the
// dead-letter topic, as the forwarder does.
func deadLetterPublisher(t *testing.T, ctx context.Context, cfg kafka.Config) func(prefix string, n int) {
	tr := &kafkago.Transport{}
	w := &kafkago.Writer{Addr: kafkago.TCP(cfg.Brokers...), Balancer: &kafkago.Hash{}, RequiredAcks: kafkago.RequireAll,
		BatchTimeout: time.Millisecond, Transport: tr}
	t.Cleanup(func() {
		_ = w.Close()
		tr.CloseIdleConnections()
	})
	return func(prefix string, n int) {
		for i := range n {
			key := fmt.Sprintf("%s-%d", prefix, i)
			body, err := json.Marshal(broker.DeadLetter{Key: key, Body: []byte(`{}`), Reason: "x"})
			require.NoError(t, err)
			require.NoError(t, w.WriteMessages(ctx, kafkago.Message{Topic: cfg.Prefix + broker.DeadLetterTopic, Key: []byte(key), Value: body}))
		}
	}
}
