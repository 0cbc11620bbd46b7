package api_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// rabbitConfig is a RabbitMQ config on a prefix of the test's own, whose
// topology is deleted when the test ends.
func rabbitConfig(t testing.TB) rabbitmq.Config {
	cfg := rabbitmq.Config{URL: testsvc.AMQPURL(t), Prefix: testsvc.AMQPPrefix(t),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rabbitmq.DeleteTopology(ctx, cfg); err != nil {
			t.Errorf("delete topology: %v", err)
		}
	})
	return cfg
}

// rabbitClients opens a publisher and an inspector, closed at cleanup.
func rabbitClients(t testing.TB, cfg rabbitmq.Config) (*rabbitmq.Publisher, *rabbitmq.Inspector) {
	ctx := context.Background()
	pub, err := rabbitmq.NewPublisher(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	insp, err := rabbitmq.NewInspector(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = insp.Close() })
	return pub, insp
}

func newRabbitHarness(t *testing.T, opts ...harnessOpt) (*harness, rabbitmq.Config) {
	cfg := rabbitConfig(t)
	pub, insp := rabbitClients(t, cfg)
	return newHarnessWith(t, pub, insp, opts...), cfg
}

func TestRabbitMQSubmitIsDurableAndIdempotent(t *testing.T) {
	t.Parallel()
	h, cfg := newRabbitHarness(t)
	ctx := context.Background()

	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range codes {
		wg.Go(func() { codes[i] = h.submit(keyAcme, "rmq-1").Code })
	}
	wg.Wait()
	created := 0
	for _, c := range codes {
		require.Contains(t, []int{http.StatusAccepted, http.StatusOK}, c)
		if c == http.StatusAccepted {
			created++
		}
	}
	require.Equal(t, 1, created)
	require.Equal(t, http.StatusOK, h.submit(keyAcme, "rmq-1").Code)
	rec, err := h.store.Get(ctx, job.Key{Tenant: "acme", ID: "rmq-1"})
	require.NoError(t, err)
	assert.Equal(t, job.StatusQueued, rec.Status)
	assert.EqualValues(t, 1, h.depth(job.PriorityNormal), "one message for one job")

	sub, err := rabbitmq.NewSubscriber(ctx, cfg)
	require.NoError(t, err)
	defer sub.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(cctx, job.PriorityNormal, 1)
	require.NoError(t, err)
	select {
	case d := <-ch:
		assert.Equal(t, "rmq-1", d.Message().Key)
		key, err := job.ReadKey(d.Message().Body)
		require.NoError(t, err)
		assert.Equal(t, job.Key{Tenant: "acme", ID: "rmq-1"}, key)
		require.NoError(t, d.Ack(cctx))
	case <-cctx.Done():
		t.Fatal("no message on the lane")
	}
}

func TestRabbitMQBrokerDownAnswers503(t *testing.T) {
	t.Parallel()
	h, _ := newRabbitHarness(t)
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "before").Code)
	require.NoError(t, h.pub.Close()) // the broker is gone for this producer
	r := h.submit(keyAcme, "during")
	require.Equal(t, http.StatusServiceUnavailable, r.Code, "%s", r.Body)
	assert.Equal(t, api.CodeBrokerUnavailable, r.apiError(t).Error.Code)
	_, err := h.store.Get(context.Background(), job.Key{Tenant: "acme", ID: "during"})
	require.ErrorIs(t, err, store.ErrNotFound, "nothing half-created")
	assert.EqualValues(t, 1, h.depth(job.PriorityNormal))

	// A batch reports the outage per item.
	r = h.do("POST", "/v1/jobs:batch", keyAcme, []byte("["+string(jobBody("b1", nil))+"]"))
	require.Equal(t, http.StatusAccepted, r.Code)
	var resp api.BatchResponse
	r.json(t, &resp)
	require.Len(t, resp.Results, 1)
	assert.Equal(t, http.StatusServiceUnavailable, resp.Results[0].HTTPStatus)
	assert.Equal(t, api.CodeBrokerUnavailable, resp.Results[0].Error.Code)
}

func TestRabbitMQUnreachableBrokerFailsAtStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// Port 1 on loopback: nothing listens there.
	_, err := rabbitmq.NewPublisher(ctx, rabbitmq.Config{URL: "amqp://guest:guest@127.0.0.1:1/", ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "guest:guest", "the URL's credentials stay out of errors")
}

// Back-pressure counts messages published straight onto the queue (no
// Postgres row yet): the backlog is the larger of the two views.
func TestRabbitMQBackpressureSeesBrokerDepth(t *testing.T) {
	t.Parallel()
	h, _ := newRabbitHarness(t, withLimits(2, 4))
	ctx := context.Background()
	for i := range 3 {
		require.NoError(t, h.pub.Publish(ctx, job.PriorityLow, broker.Message{Key: fmt.Sprintf("direct-%d", i), Body: jobBody(fmt.Sprintf("direct-%d", i), nil)}))
	}
	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "api-1").Code)
	st := h.refresh()
	assert.EqualValues(t, 3, st.Backlog[job.PriorityLow])
	assert.EqualValues(t, 1, st.Backlog[job.PriorityNormal])
	assert.Equal(t, api.StateFull, st.State)
	r := h.submit(keyAcme, "api-2")
	require.Equal(t, http.StatusTooManyRequests, r.Code)
	assert.NotEmpty(t, r.Header.Get("Retry-After"))
}
