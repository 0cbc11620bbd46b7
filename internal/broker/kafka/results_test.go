package kafka_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
)

// readAll reads n records from topic, from its start.
func readAll(t *testing.T, ctx context.Context, brokers []string, topic string, n int) []kafkago.Message {
	t.Helper()
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	var out []kafkago.Message
	for len(out) < n {
		m, err := r.ReadMessage(ctx)
		require.NoError(t, err, "read %s: got %d of %d", topic, len(out), n)
		out = append(out, m)
	}
	return out
}

// Result events land on llmq.results keyed by job id with their event id
// in a header, and on the job's own result topic, created on first use.
func TestPublishResults(t *testing.T) {
	cfg := testConfig(t)
	cfg.Partitions = 1
	p := newPublisher(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	own := cfg.Prefix + "acme.results"
	unroutable, err := p.PublishResults(ctx, []broker.ResultMessage{
		{EventID: "e1", Type: "job.succeeded", Tenant: "acme", JobID: "j1", RoutingKey: "acme.succeeded", Body: []byte(`{"n":1}`), Topic: own},
		{EventID: "e2", Type: "job.failed", Tenant: "acme", JobID: "j2", RoutingKey: "acme.failed", Body: []byte(`{"n":2}`),
			ReplyTo: "llmq.reply.acme.x"},
	})
	require.NoError(t, err)
	assert.Empty(t, unroutable, "Kafka has no reply queues to miss")

	all := readAll(t, ctx, cfg.Brokers, cfg.ResultsTopic(), 2)
	keys := map[string]string{}
	for _, m := range all {
		for _, h := range m.Headers {
			if h.Key == "event_id" {
				keys[string(m.Key)] = string(h.Value)
			}
		}
	}
	assert.Equal(t, map[string]string{"j1": "e1", "j2": "e2"}, keys)
	mine := readAll(t, ctx, cfg.Brokers, own, 1)
	assert.Equal(t, "j1", string(mine[0].Key))
	assert.JSONEq(t, `{"n":1}`, string(mine[0].Value))
}

// An event larger than the writer takes (provider answers may be up to
// 8 MiB, a batch 1 MiB) is reported refused alone; the others of the
// call are written. It used to fail the whole call, every time.
func TestPublishResultsReportsAnEventTooLargeAlone(t *testing.T) {
	cfg := testConfig(t)
	cfg.Partitions = 1
	p := newPublisher(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := bytes.Repeat([]byte("a"), 1<<20+100)
	_, err := p.PublishResults(ctx, []broker.ResultMessage{
		{EventID: "e1", Type: "job.succeeded", Tenant: "acme", JobID: "big", RoutingKey: "acme.succeeded", Body: big},
		{EventID: "e2", Type: "job.succeeded", Tenant: "acme", JobID: "small", RoutingKey: "acme.succeeded", Body: []byte(`{}`)},
	})
	var refused *broker.ResultsRefused
	require.ErrorAs(t, err, &refused)
	require.Len(t, refused.Refused, 1)
	assert.ErrorContains(t, refused.Refused[0], "over the writer's batch limit")
	got := readAll(t, ctx, cfg.Brokers, cfg.ResultsTopic(), 1)
	assert.Equal(t, "small", string(got[0].Key))
}

// An event larger than the writer takes goes without its response when
// the relay gave it a slim copy: to llmq.results and to the job's own
// topic alike. It used to be put off and, after ~3 minutes, given up.
func TestPublishResultsSendsAnEventTooLargeWithoutItsResponse(t *testing.T) {
	cfg := testConfig(t)
	cfg.Partitions = 1
	p := newPublisher(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	own := cfg.Prefix + "acme.own"
	slims := 0
	big := bytes.Repeat([]byte("a"), 1<<20+100)
	_, err := p.PublishResults(ctx, []broker.ResultMessage{
		{EventID: "e1", Type: "job.succeeded", Tenant: "acme", JobID: "big", RoutingKey: "acme.succeeded", Body: big, Topic: own,
			Slim: func() ([]byte, error) { slims++; return []byte(`{"slim":true}`), nil }},
		{EventID: "e2", Type: "job.succeeded", Tenant: "acme", JobID: "small", RoutingKey: "acme.succeeded", Body: []byte(`{}`)},
	})
	require.NoError(t, err)
	assert.Equal(t, 1, slims, "one slim copy for both topics")
	got := map[string]string{}
	for _, m := range readAll(t, ctx, cfg.Brokers, cfg.ResultsTopic(), 2) {
		got[string(m.Key)] = string(m.Value)
	}
	assert.Equal(t, map[string]string{"big": `{"slim":true}`, "small": `{}`}, got)
	mine := readAll(t, ctx, cfg.Brokers, own, 1)
	assert.Equal(t, `{"slim":true}`, string(mine[0].Value))
}

// A topic whose max.message.bytes is below the writer's limit refuses the
// event at the broker: the slim copy is written instead, and an event
// without one is refused alone, as before.
func TestPublishResultsSlimsAnEventTheBrokerRefusesForItsSize(t *testing.T) {
	cfg := testConfig(t)
	cfg.Partitions = 1
	p := newPublisher(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafkago.Client{Addr: kafkago.TCP(cfg.Brokers...), Transport: tr}
	resp, err := client.AlterConfigs(ctx, &kafkago.AlterConfigsRequest{Resources: []kafkago.AlterConfigRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: cfg.ResultsTopic(),
		Configs: []kafkago.AlterConfigRequestConfig{{Name: "max.message.bytes", Value: "4096"}},
	}}})
	require.NoError(t, err)
	for _, e := range resp.Errors {
		require.NoError(t, e)
	}
	body := bytes.Repeat([]byte("b"), 20_000)
	_, err = p.PublishResults(ctx, []broker.ResultMessage{
		{EventID: "e1", Type: "job.succeeded", Tenant: "acme", JobID: "slimmed", RoutingKey: "acme.succeeded", Body: body,
			Slim: func() ([]byte, error) { return []byte(`{"slim":true}`), nil }},
		{EventID: "e2", Type: "job.failed", Tenant: "acme", JobID: "no-slim", RoutingKey: "acme.failed", Body: body},
		{EventID: "e3", Type: "job.succeeded", Tenant: "acme", JobID: "small", RoutingKey: "acme.succeeded", Body: []byte(`{}`)},
	})
	var refused *broker.ResultsRefused
	require.ErrorAs(t, err, &refused)
	require.Len(t, refused.Refused, 1)
	assert.ErrorContains(t, refused.Refused[1], "too large")
	got := map[string]string{}
	for _, m := range readAll(t, ctx, cfg.Brokers, cfg.ResultsTopic(), 2) {
		got[string(m.Key)] = string(m.Value)
	}
	assert.Equal(t, map[string]string{"slimmed": `{"slim":true}`, "small": `{}`}, got)
}
