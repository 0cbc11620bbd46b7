package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
)

// Result events reach the topic exchange under <tenant>.<status> with
// their event id as message-id, and the reply queue with the correlation
// id; a reply queue that does not exist is reported, not an error.
func TestPublishResults(t *testing.T) {
	cfg := testConfig(t)
	p := newPublisher(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	conn, err := amqp.Dial(cfg.URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	sub, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(sub.Name, "acme.*", cfg.Prefix+broker.ResultsName, false, nil))
	reply := cfg.Prefix + "llmq.reply.acme.t1"
	// Exclusive: gone with the connection (a queue that never had a
	// consumer is not auto-deleted).
	_, err = ch.QueueDeclare(reply, false, false, true, false, nil)
	require.NoError(t, err)

	msgs := []broker.ResultMessage{
		{EventID: "e1", Type: "job.succeeded", Tenant: "acme", JobID: "j1", RoutingKey: "acme.succeeded", Body: []byte(`{"n":1}`),
			ReplyTo: reply, CorrelationID: "c1"},
		{EventID: "e2", Type: "job.failed", Tenant: "globex", JobID: "j2", RoutingKey: "globex.failed", Body: []byte(`{"n":2}`)},
		{EventID: "e3", Type: "job.dead", Tenant: "acme", JobID: "j3", RoutingKey: "acme.dead", Body: []byte(`{"n":3}`),
			ReplyTo: cfg.Prefix + "llmq.reply.acme.gone"},
	}
	unroutable, err := p.PublishResults(ctx, msgs)
	require.NoError(t, err)
	assert.Equal(t, []int{2}, unroutable)

	got := map[string]amqp.Delivery{}
	deliveries, err := ch.Consume(sub.Name, "", true, false, false, false, nil)
	require.NoError(t, err)
	for len(got) < 2 {
		select {
		case d := <-deliveries:
			got[d.MessageId] = d
		case <-ctx.Done():
			t.Fatalf("results bound to acme.*: got %d of 2", len(got))
		}
	}
	assert.Equal(t, "acme.succeeded", got["e1"].RoutingKey)
	assert.Equal(t, "job.dead", got["e3"].Type)
	assert.Equal(t, "acme", got["e1"].Headers["tenant"])
	assert.NotContains(t, got, "e2", "another tenant's event is not bound to acme.*")

	d, ok, err := ch.Get(reply, true)
	require.NoError(t, err)
	require.True(t, ok, "the reply queue got the event")
	assert.Equal(t, "c1", d.CorrelationId)
	assert.Equal(t, "e1", d.MessageId)
	assert.JSONEq(t, `{"n":1}`, string(d.Body))
}

// A tenant's reply queue that is full and rejects publishes nacks its
// copy of an event: that event alone is reported refused, and the other
// events of the call are published (they used to fail with it, every
// time, and every later event with them).
func TestPublishResultsReportsAFullReplyQueueAlone(t *testing.T) {
	cfg := testConfig(t)
	p := newPublisher(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := amqp.Dial(cfg.URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	sub, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(sub.Name, "globex.*", cfg.Prefix+broker.ResultsName, false, nil))
	full := cfg.Prefix + "llmq.reply.acme.full"
	_, err = ch.QueueDeclare(full, false, false, true, false, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	require.NoError(t, err)

	acme := broker.ResultMessage{EventID: "e1", Type: "job.succeeded", Tenant: "acme", JobID: "j1", RoutingKey: "acme.succeeded",
		Body: []byte(`{}`), ReplyTo: full}
	_, err = p.PublishResults(ctx, []broker.ResultMessage{acme}) // fills the queue
	require.NoError(t, err)
	globex := broker.ResultMessage{EventID: "e2", Type: "job.succeeded", Tenant: "globex", JobID: "j2", RoutingKey: "globex.succeeded", Body: []byte(`{}`)}
	_, err = p.PublishResults(ctx, []broker.ResultMessage{acme, globex})
	var refused *broker.ResultsRefused
	require.ErrorAs(t, err, &refused)
	require.Len(t, refused.Refused, 1)
	assert.ErrorIs(t, refused.Refused[0], broker.ErrRejected)

	deliveries, err := ch.Consume(sub.Name, "", true, false, false, false, nil)
	require.NoError(t, err)
	select {
	case d := <-deliveries:
		assert.Equal(t, "e2", d.MessageId, "globex's event was published")
	case <-ctx.Done():
		t.Fatal("globex's event was not published")
	}
}
