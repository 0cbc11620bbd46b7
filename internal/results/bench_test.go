package results_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/cpustat"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// BenchmarkRelay measures result events published per second: b.N jobs
// finish (one bulk UPDATE, so the triggers fill the outbox) before the
// clock, then one relay drains the outbox to the broker, with a queue
// bound to every event on RabbitMQ so the broker stores them as a reader
// would have it. rabbitmq-unheard has no such queue, as in a deployment
// where nobody reads llmq.results and no job names a destination: the
// relay then only empties the outbox.
//
//	go test -run '^$' -bench Relay -benchtime 20000x ./internal/results/
func BenchmarkRelay(b *testing.B) {
	b.Run("rabbitmq", func(b *testing.B) { benchRelayRabbitMQ(b, true) })
	b.Run("rabbitmq-unheard", func(b *testing.B) { benchRelayRabbitMQ(b, false) })
	b.Run("kafka", func(b *testing.B) {
		pub, err := kafka.NewPublisher(context.Background(), kafka.Config{Brokers: testsvc.KafkaBrokers(b), Prefix: testsvc.KafkaPrefix(b)})
		require.NoError(b, err)
		defer pub.Close()
		benchRelay(b, pub)
	})
}

// benchRelayRabbitMQ relays to RabbitMQ, with a queue bound to every
// result event when bound.
func benchRelayRabbitMQ(b *testing.B, bound bool) {
	cfg := rabbitmq.Config{URL: testsvc.AMQPURL(b), Prefix: testsvc.AMQPPrefix(b)}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rabbitmq.DeleteTopology(ctx, cfg); err != nil {
			b.Errorf("delete topology: %v", err)
		}
	})
	pub, err := rabbitmq.NewPublisher(context.Background(), cfg)
	require.NoError(b, err)
	defer pub.Close()
	if bound {
		conn, err := amqp.Dial(cfg.URL)
		require.NoError(b, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(b, err)
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		require.NoError(b, err)
		require.NoError(b, ch.QueueBind(q.Name, "#", cfg.Prefix+broker.ResultsName, false, nil))
	}
	benchRelay(b, pub)
}

func benchRelay(b *testing.B, pub broker.ResultPublisher) {
	ctx := context.Background()
	pool := testsvc.Postgres(b)
	s := store.New(pool)
	jobs := make([]job.Job, 0, 1000)
	for i := 0; i < b.N; i++ {
		jobs = append(jobs, job.Job{ID: fmt.Sprintf("r-%d", i), Tenant: "bench", Model: "m",
			Request: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}]}`), Metadata: json.RawMessage(`{"ticket":1}`)})
		if len(jobs) == cap(jobs) || i == b.N-1 {
			_, err := s.InsertBatch(ctx, jobs)
			require.NoError(b, err)
			jobs = jobs[:0]
		}
	}
	// Finished as a chat job finishes, with a response of the size a short
	// answer has.
	response := fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,`+
		`"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":250,"completion_tokens":40,"total_tokens":290}}`, strings.Repeat("answer ", 30))
	_, err := pool.Exec(ctx, `UPDATE jobs SET status = 'succeeded', model_used = 'm', response = $1::jsonb,
		attempts = 1, started_at = now(), completed_at = now(), prompt_tokens = 250, completion_tokens = 40
		WHERE tenant = 'bench'`, response)
	require.NoError(b, err)
	relay := results.NewRelay(results.RelayParams{Store: s, Publisher: pub})
	b.ResetTimer()
	cpu := cpustat.Start(pool, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	start := time.Now()
	total, err := relay.Drain(ctx)
	require.NoError(b, err)
	require.Equal(b, b.N, total)
	b.ReportMetric(float64(total)/time.Since(start).Seconds(), "events/s")
	// Per event: the relay's process, its Postgres backends, the RabbitMQ node.
	cpu.Report(b, total, "relay")
}
