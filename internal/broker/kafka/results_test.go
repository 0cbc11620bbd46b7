package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
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
	cfg, p, ctx := onePartition(t)
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
	cfg, p, ctx := onePartition(t)
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
	cfg, p, ctx := onePartition(t)
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

// onePartition is a publisher whose topics have one partition, and a
// context for the test.
func onePartition(t *testing.T) (kafka.Config, *kafka.Publisher, context.Context) {
	cfg := testConfig(t)
	cfg.Partitions = 1
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return cfg, newPublisher(t, cfg), ctx
}

// limitTopic sets a topic's max.message.bytes: the broker then refuses a
// record batch larger than that, whatever its records.
func limitTopic(t *testing.T, ctx context.Context, brokers []string, topic string, bytes int) {
	t.Helper()
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr}
	resp, err := client.AlterConfigs(ctx, &kafkago.AlterConfigsRequest{Resources: []kafkago.AlterConfigRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic,
		Configs: []kafkago.AlterConfigRequestConfig{{Name: "max.message.bytes", Value: strconv.Itoa(bytes)}},
	}}})
	require.NoError(t, err)
	for _, e := range resp.Errors {
		require.NoError(t, e)
	}
}

// slimMessage is a result message whose slim copy is {"slim":true}, and
// which counts in published the calls that published it slim.
func slimMessage(id string, body []byte, published *atomic.Int64) broker.ResultMessage {
	return broker.ResultMessage{EventID: "e-" + id, Type: "job.succeeded", Tenant: "acme", JobID: id, RoutingKey: "acme.succeeded",
		Body: body, Slim: func() ([]byte, error) { return []byte(`{"slim":true}`), nil }, SlimPublished: func() { published.Add(1) }}
}

// A topic whose max.message.bytes is below the writer's limit refuses the
// event at the broker: the slim copy is written instead, and an event
// without one is refused alone, as before.
func TestPublishResultsSlimsAnEventTheBrokerRefusesForItsSize(t *testing.T) {
	cfg, p, ctx := onePartition(t)
	limitTopic(t, ctx, cfg.Brokers, cfg.ResultsTopic(), 4096)
	var published atomic.Int64
	body := bytes.Repeat([]byte("b"), 20_000)
	_, err := p.PublishResults(ctx, []broker.ResultMessage{
		slimMessage("slimmed", body, &published),
		{EventID: "e2", Type: "job.failed", Tenant: "acme", JobID: "no-slim", RoutingKey: "acme.failed", Body: body},
		slimMessage("small", []byte(`{}`), &published),
	})
	var refused *broker.ResultsRefused
	require.ErrorAs(t, err, &refused)
	require.Len(t, refused.Refused, 1)
	assert.ErrorContains(t, refused.Refused[1], "Too Large")
	got := map[string]string{}
	for _, m := range readAll(t, ctx, cfg.Brokers, cfg.ResultsTopic(), 2) {
		got[string(m.Key)] = string(m.Value)
	}
	assert.Equal(t, map[string]string{"slimmed": `{"slim":true}`, "small": `{}`}, got)
	assert.EqualValues(t, 1, published.Load(), "one event went slim")
}

// Events that each fit the topic but not all together, from calls that
// run at once (the relay's two rounds): every one is written whole, none
// slimmed, none refused. Retried through the shared writer, one call's
// records shared batches with the other's and went slim or were refused.
func TestPublishResultsSplitsABatchTheBrokerRefusesForItsSize(t *testing.T) {
	cfg, p, ctx := onePartition(t)
	limitTopic(t, ctx, cfg.Brokers, cfg.ResultsTopic(), 4096)
	var published atomic.Int64
	call := func(c int) error {
		var msgs []broker.ResultMessage
		for k := range 13 {
			body := []byte(`{}`)
			if k%4 == 0 {
				body = bytes.Repeat([]byte("m"), 2500) // fits alone, not two together
			}
			msgs = append(msgs, slimMessage(fmt.Sprintf("c%d-%d", c, k), body, &published))
		}
		_, err := p.PublishResults(ctx, msgs)
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for c := range errs {
		wg.Go(func() { errs[c] = call(c) })
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	assert.Zero(t, published.Load(), "nothing slimmed that fits alone")
	whole := 0
	for _, m := range readAll(t, ctx, cfg.Brokers, cfg.ResultsTopic(), 26) {
		if !bytes.Contains(m.Value, []byte("slim")) {
			whole++
		}
	}
	assert.Equal(t, 26, whole)
}

// A job's own topic that refuses the event for its size gets the slim
// copy; llmq.results, which takes it, keeps the whole event.
func TestPublishResultsSlimsOnlyTheCopyRefused(t *testing.T) {
	cfg, p, ctx := onePartition(t)
	own := cfg.Prefix + "acme.small-topic"
	_, err := p.PublishResults(ctx, []broker.ResultMessage{{EventID: "e0", Type: "job.succeeded", Tenant: "acme", JobID: "first",
		RoutingKey: "acme.succeeded", Body: []byte(`{}`), Topic: own}}) // creates the topic
	require.NoError(t, err)
	limitTopic(t, ctx, cfg.Brokers, own, 4096)
	var published atomic.Int64
	m := slimMessage("big", bytes.Repeat([]byte("b"), 20_000), &published)
	m.Topic = own
	_, err = p.PublishResults(ctx, []broker.ResultMessage{m})
	require.NoError(t, err)
	assert.EqualValues(t, 1, published.Load())
	all := readAll(t, ctx, cfg.Brokers, cfg.ResultsTopic(), 2)
	assert.Len(t, all[1].Value, 20_000, "llmq.results took the whole event")
	mine := readAll(t, ctx, cfg.Brokers, own, 2)
	assert.Equal(t, `{"slim":true}`, string(mine[1].Value))
}

// A call that runs out of time before it can split its refused batch (the
// other round holds the split writer) reports those events out of time,
// which the relay tries again without counting a refusal.
func TestPublishResultsOutOfTimeIsNotARefusal(t *testing.T) {
	cfg, p, ctx := onePartition(t)
	limitTopic(t, ctx, cfg.Brokers, cfg.ResultsTopic(), 4096)
	release := kafka.HoldSplitTurn(p)
	defer release()
	var published atomic.Int64
	mid := bytes.Repeat([]byte("m"), 2500)
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := p.PublishResults(short, []broker.ResultMessage{slimMessage("a", mid, &published), slimMessage("b", mid, &published)})
	var refused *broker.ResultsRefused
	require.ErrorAs(t, err, &refused)
	require.Len(t, refused.Refused, 2)
	for _, rerr := range refused.Refused {
		assert.ErrorIs(t, rerr, broker.ErrOutOfTime)
	}
	assert.Zero(t, published.Load())
}
