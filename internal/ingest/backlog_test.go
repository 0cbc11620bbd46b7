package ingest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// A raw publisher is what a ticket or moderation backend runs: the broker's
// own client library, no llmq code, publishing to the contract's names.
type rawPublisher interface {
	// publish sends bodies (job ids ids) on lane and returns once the
	// broker has confirmed all of them.
	publish(t testing.TB, lane job.Priority, ids []string, bodies [][]byte)
}

// realBroker is one broker under test: a raw publisher onto its intake and
// llmq's intake subscriber and lane publisher on the same names.
type realBroker struct {
	raw    rawPublisher
	intake broker.Subscriber
	lanes  broker.Publisher
}

type rawRabbit struct {
	ch       *amqp.Channel
	exchange string
}

func (r *rawRabbit) publish(t testing.TB, lane job.Priority, ids []string, bodies [][]byte) {
	t.Helper()
	ctx := context.Background()
	const window = 2000
	var pending []*amqp.DeferredConfirmation
	flush := func() {
		for _, c := range pending {
			ok, err := c.WaitContext(ctx)
			require.NoError(t, err)
			require.True(t, ok, "the broker nacked a raw publish")
		}
		pending = pending[:0]
	}
	for i, body := range bodies {
		c, err := r.ch.PublishWithDeferredConfirmWithContext(ctx, r.exchange, string(lane), false, false, amqp.Publishing{
			MessageId: ids[i], DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: body,
		})
		require.NoError(t, err)
		pending = append(pending, c)
		if len(pending) == window {
			flush()
		}
	}
	flush()
}

func rabbitBroker(t testing.TB) realBroker {
	t.Helper()
	ctx := context.Background()
	cfg := rabbitmq.Config{URL: testsvc.AMQPURL(t), Prefix: testsvc.AMQPPrefix(t)}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := rabbitmq.DeleteTopology(ctx, cfg); err != nil {
			t.Errorf("delete topology: %v", err)
		}
	})
	intake, err := rabbitmq.NewIntakeSubscriber(ctx, cfg) // declares the topology
	require.NoError(t, err)
	t.Cleanup(func() { _ = intake.Close() })
	lanes, err := rabbitmq.NewPublisher(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lanes.Close() })
	conn, err := amqp.Dial(cfg.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	return realBroker{raw: &rawRabbit{ch: ch, exchange: cfg.Prefix + "llmq.jobs"}, intake: intake, lanes: lanes}
}

type rawKafka struct {
	w      *kafkago.Writer
	prefix string
}

func (k *rawKafka) publish(t testing.TB, lane job.Priority, ids []string, bodies [][]byte) {
	t.Helper()
	const chunk = 2000
	for lo := 0; lo < len(bodies); lo += chunk {
		hi := min(lo+chunk, len(bodies))
		msgs := make([]kafkago.Message, 0, hi-lo)
		for i := lo; i < hi; i++ {
			msgs = append(msgs, kafkago.Message{Topic: k.prefix + "llmq.jobs." + string(lane), Key: []byte(ids[i]), Value: bodies[i]})
		}
		require.NoError(t, k.w.WriteMessages(context.Background(), msgs...))
	}
}

func kafkaBroker(t testing.TB) realBroker {
	t.Helper()
	ctx := context.Background()
	cfg := kafka.Config{Brokers: testsvc.KafkaBrokers(t), Prefix: testsvc.KafkaPrefix(t)}
	intake, err := kafka.NewIntakeSubscriber(ctx, cfg) // creates the topics
	require.NoError(t, err)
	t.Cleanup(func() { _ = intake.Close() })
	lanes, err := kafka.NewPublisher(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lanes.Close() })
	// A transport of its own, closed at the end: kafka-go's shared default
	// keeps its connections (and goroutines) for ever.
	tr := &kafkago.Transport{}
	w := &kafkago.Writer{Addr: kafkago.TCP(cfg.Brokers...), Balancer: &kafkago.Hash{}, BatchTimeout: 2 * time.Millisecond,
		BatchSize: 1000, RequiredAcks: kafkago.RequireAll, Transport: tr}
	t.Cleanup(func() { _ = w.Close(); tr.CloseIdleConnections() })
	return realBroker{raw: &rawKafka{w: w, prefix: cfg.Prefix}, intake: intake, lanes: lanes}
}

// runIngester runs an ingester until the test ends.
func runIngester(t testing.TB, cfg ingest.Config, st *store.Store, intake broker.Subscriber, lanes broker.Publisher) {
	t.Helper()
	in, err := ingest.New(cfg, ingest.Deps{Store: st, Intake: intake, Lanes: lanes, Logger: testLogger()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Error("ingester did not stop within a minute")
		}
	})
}

func rawJobs(prefix string, n int) (ids []string, bodies [][]byte) {
	ids, bodies = make([]string, n), make([][]byte, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%06d", prefix, i)
		bodies[i] = fmt.Appendf(nil, `{"id":%q,"tenant":"support","model":"qwen-plus","request":{"messages":[{"role":"user","content":"summarise ticket %d"}],"max_tokens":64}}`, ids[i], i)
	}
	return ids, bodies
}

// waitVisible polls GET-by-id for key until it has a row (bounded).
func waitVisible(t testing.TB, st *store.Store, key job.Key, within time.Duration) store.Record {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		rec, err := st.Get(context.Background(), key)
		if err == nil {
			return rec
		}
		require.ErrorIs(t, err, store.ErrNotFound)
		if time.Now().After(deadline) {
			t.Fatalf("job %s has no row within %s", key.ID, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRawBacklogIsVisible: the last job of a 50,000-message backlog
// published raw is visible as queued, on both brokers (no worker runs, so
// the whole backlog waits on the lanes). In-process kfake gets 10,000:
// under -race beside the other packages' tests it shares the test binary's
// CPU, and 50,000 messages took more than five minutes there in CI.
func TestRawBacklogIsVisible(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 50,000 messages per broker; not with -short")
	}
	for name, open := range map[string]func(testing.TB) realBroker{"rabbitmq": rabbitBroker, "kafka": kafkaBroker} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := store.New(testsvc.Postgres(t))
			b := open(t)
			n := 50000
			if name == "kafka" && testsvc.KafkaInProcess() {
				n = 10000
			}
			ids, bodies := rawJobs("backlog", n)
			b.raw.publish(t, job.PriorityNormal, ids, bodies)
			runIngester(t, ingest.Config{}, st, b.intake, b.lanes)
			rec := waitVisible(t, st, job.Key{Tenant: "support", ID: ids[n-1]}, 5*time.Minute)
			require.Equal(t, job.StatusQueued, rec.Status)
			// A liveness bound, not a speed target (BenchmarkIngest measures
			// the rate).
			waitRows(t, st, int64(n), 5*time.Minute)
		})
	}
}

// waitRows waits until the store holds n jobs (bounded) and returns when
// that happened.
func waitRows(t testing.TB, st *store.Store, n int64, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		backlog, err := st.Backlog(context.Background())
		require.NoError(t, err)
		var got int64
		for _, v := range backlog {
			got += v
		}
		if got >= n {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs stored within %s", got, n, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
