package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
)

// benchRelay runs the result relay beside a benchmark's worker, as
// `consumer run` does, so the figures include publishing every event.
// finish waits for the outbox to empty and reports how long after the
// last job that took (results_lag_ms).
func benchRelay(b *testing.B, st *store.Store, pub broker.Publisher) (finish func()) {
	rp, ok := pub.(broker.ResultPublisher)
	require.True(b, ok, "the publisher publishes results")
	relay := results.NewRelay(results.RelayParams{Store: st, Publisher: rp})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { relay.Run(ctx) })
	return func() {
		start := time.Now()
		for {
			n, _, err := st.PendingResults(context.Background())
			require.NoError(b, err)
			if n == 0 {
				break
			}
			require.Less(b, time.Since(start), 5*time.Minute, "the outbox did not drain")
			time.Sleep(10 * time.Millisecond) // polling the outbox, not waiting for a signal: it has none
		}
		b.ReportMetric(float64(time.Since(start).Milliseconds()), "results_lag_ms")
		cancel()
		wg.Wait()
	}
}

// bindResults binds an auto-deleted queue to every result event of cfg's
// topology, as a subscriber would, for the benchmark's life.
func bindResults(b *testing.B, cfg rabbitmq.Config) {
	conn, err := amqp.Dial(cfg.URL)
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(b, err)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(b, err)
	require.NoError(b, ch.QueueBind(q.Name, "#", cfg.Prefix+broker.ResultsName, false, nil))
}
