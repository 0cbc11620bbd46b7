package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// A tenant's own intake topic is read beside the shared one, and only its
// deliveries carry the tenant; a record's headers cannot claim it.
func TestIntakeReadsTenantTopics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := testConfig(t)
	cfg.TenantTopics = []string{"acme"}
	p := newPublisher(t, cfg)
	require.NoError(t, p.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: "shared", Body: []byte("s"),
		Headers: map[string]string{"tenant": "acme"}}))
	require.NoError(t, p.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: "own", Body: []byte("o"), IntakeTenant: "acme"}))

	depth, err := newInspector(t, cfg).Depth(ctx, job.PriorityNormal)
	require.NoError(t, err)
	assert.EqualValues(t, 2, depth, "Depth counts the tenant's topic too")

	ch, err := newIntakeSubscriber(t, cfg).Subscribe(ctx, job.PriorityNormal, 10)
	require.NoError(t, err)
	got := map[string]string{}
	for len(got) < 2 {
		select {
		case d := <-ch:
			got[d.Message().Key] = d.Message().IntakeTenant
			assert.Equal(t, job.PriorityNormal, d.Lane())
			require.NoError(t, d.Ack(ctx))
		case <-ctx.Done():
			t.Fatalf("received %v of 2 within a minute", got)
		}
	}
	assert.Equal(t, map[string]string{"shared": "", "own": "acme"}, got)
}
