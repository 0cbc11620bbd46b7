package kafka_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/job"
)

// A commit the broker fails (a restart, a coordinator that moved) is tried
// again until it holds. It used to be dropped: the group's offset stayed
// behind the settled message until another message of the partition was
// settled, so the lane's depth counted it for ever and the next reader got
// it again. Fault injection needs kfake's control hooks, so this test runs
// on its own in-process cluster whatever LLMQ_TEST_KAFKA_BROKERS says.
func TestFailedCommitIsRetried(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	var failing atomic.Bool
	var failures atomic.Int32
	c.ControlKey(int16(kmsg.OffsetCommit), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !failing.Load() {
			return nil, nil, false
		}
		req := r.(*kmsg.OffsetCommitRequest)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		resp.SetVersion(req.Version)
		for _, rt := range req.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, p := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition = p.Partition
				sp.ErrorCode = kerr.RequestTimedOut.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		failures.Add(1)
		return resp, nil, true
	})
	cfg := kafka.Config{Brokers: c.ListenAddrs(), Prefix: "commitretry."}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := newPublisher(t, cfg)
	insp := newInspector(t, cfg)
	require.NoError(t, p.Publish(ctx, job.PriorityNormal, broker.Message{Key: "a", Body: []byte("a")}))
	sub, err := kafka.NewSubscriber(ctx, cfg)
	require.NoError(t, err)
	ch, err := sub.Subscribe(ctx, job.PriorityNormal, 5)
	require.NoError(t, err)
	d := receive(t, ctx, ch)
	failing.Store(true)
	require.NoError(t, d.Ack(ctx))
	// kafka-go tries a commit 3 times; a fourth failed request is llmq's
	// own retry of the commit kafka-go gave up.
	require.Eventually(t, func() bool { return failures.Load() >= 4 }, time.Minute, 20*time.Millisecond,
		"the commit was tried again after kafka-go gave up")
	failing.Store(false) // the broker is healthy again

	require.Eventually(t, func() bool {
		depth, err := insp.Depth(ctx, job.PriorityNormal)
		return err == nil && depth == 0
	}, time.Minute, 100*time.Millisecond, "the settled message's offset is committed once the broker recovers")
	require.NoError(t, sub.Close())
	again := subscribeNew(t, ctx, cfg, job.PriorityNormal)
	select {
	case d := <-again:
		t.Errorf("the acked message %s was delivered again to the next reader", d.Message().Key)
		_ = d.Ack(ctx)
	case <-time.After(3 * time.Second):
	}
}
