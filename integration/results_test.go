package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
)

// resultWatch is a queue bound to llmq.results with "#" (every tenant and
// status) and a reply queue, read by the test.
type resultWatch struct {
	t      *testing.T
	ch     *amqp.Channel
	events <-chan amqp.Delivery
	reply  string
}

func watchResults(t *testing.T, amqpURL, replyQueue string) *resultWatch {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	// The same declaration as llmq's topology, so binding works before
	// the consumer has started.
	require.NoError(t, ch.ExchangeDeclare(broker.ResultsName, amqp.ExchangeTopic, true, false, false, false, nil))
	q, err := ch.QueueDeclare("test.results.watch", false, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "#", broker.ResultsName, false, nil))
	if replyQueue != "" {
		_, err = ch.QueueDeclare(replyQueue, false, false, false, false, nil)
		require.NoError(t, err)
	}
	events, err := ch.Consume(q.Name, "", true, false, false, false, nil)
	require.NoError(t, err)
	return &resultWatch{t: t, ch: ch, events: events, reply: replyQueue}
}

// next returns the next n events (failing after a minute).
func (w *resultWatch) next(n int, live ...*proc) []amqp.Delivery {
	w.t.Helper()
	var out []amqp.Delivery
	timeout := time.After(time.Minute)
	for len(out) < n {
		select {
		case d := <-w.events:
			out = append(out, d)
		case <-timeout:
			for _, p := range live {
				w.t.Logf("%s:\n%s", p.name, p.out.tail(40))
			}
			w.t.Fatalf("got %d of %d result events", len(out), n)
		}
	}
	return out
}

// none asserts no event arrives within d.
func (w *resultWatch) none(d time.Duration) {
	w.t.Helper()
	select {
	case ev := <-w.events:
		w.t.Fatalf("unexpected result event %s: %s", ev.RoutingKey, ev.Body)
	case <-time.After(d):
	}
}

func decodeEvent(t *testing.T, d amqp.Delivery) results.Event {
	t.Helper()
	var ev results.Event
	require.NoError(t, json.Unmarshal(d.Body, &ev), "%s", d.Body)
	require.Equal(t, results.EventVersion, ev.Version)
	require.Equal(t, ev.EventID, d.MessageId, "message-id is the event id")
	if d.Exchange == broker.ResultsName {
		require.Equal(t, results.RoutingKey(ev.Data.Tenant, ev.Data.Status), d.RoutingKey)
	}
	return ev
}

// Every terminal status produces its event on llmq.results, and a job
// published with the AMQP reply_to property gets its event on that queue
// with its correlation id, end to end through the binaries.
func TestResultsEveryStatusAndReplyTo(t *testing.T) {
	t.Parallel()
	s := newFaultStack(t, faultOptions{})
	const reply = "llmq.reply.default.e2e"
	w := watchResults(t, s.amqpURL, reply)

	// cancelled: submitted and cancelled over the API before any consumer runs.
	prod, base := s.producer()
	code, body := apiCall(t, base, http.MethodPost, "/v1/jobs", "key-acme-sec-0123456789", faultJob("cancel-1", ""))
	require.Equal(t, http.StatusAccepted, code, "%s", body)
	code, body = apiCall(t, base, http.MethodPost, "/v1/jobs/cancel-1/cancel", "key-acme-sec-0123456789", nil)
	require.Equal(t, http.StatusOK, code, "%s", body)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := s.publisher(ctx)
	defer pub.Close()
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	for _, m := range []broker.Message{
		{Key: "ok-1", Body: faultJob("ok-1", ""), ReplyTo: reply, CorrelationID: "corr-ok-1"},
		{Key: "fail-1", Body: []byte(`{"id":"fail-1","model":"no-such-model","request":{"messages":[{"role":"user","content":"x"}]}}`), ReplyTo: reply},
		{Key: "dead-1", Body: faultJob("dead-1", `,"deadline":"`+past+`","metadata":{"ticket":42}`)},
	} {
		require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, m))
	}
	c := s.consumer("w1")

	got := map[string]results.Event{}
	for _, d := range w.next(4, c, prod) {
		ev := decodeEvent(t, d)
		got[ev.Data.ID] = ev
	}
	want := map[string]string{"ok-1": "job.succeeded", "fail-1": "job.failed", "dead-1": "job.dead", "cancel-1": "job.cancelled"}
	for id, typ := range want {
		require.Contains(t, got, id)
		assert.Equal(t, typ, got[id].Type, id)
	}
	assert.Equal(t, "acme", got["cancel-1"].Data.Tenant)
	assert.JSONEq(t, `{"ticket":42}`, string(got["dead-1"].Data.Metadata), "metadata comes back")
	require.NotNil(t, got["ok-1"].Data.Usage)
	assert.Equal(t, "corr-ok-1", got["ok-1"].Data.CorrelationID)
	assert.Contains(t, got["fail-1"].Data.Error.Message, "no-such-model")

	replies := map[string]amqp.Delivery{}
	deadline := time.Now().Add(30 * time.Second)
	for len(replies) < 2 && time.Now().Before(deadline) {
		d, ok, err := w.ch.Get(reply, true)
		require.NoError(t, err)
		if !ok {
			time.Sleep(50 * time.Millisecond) // polling a queue the test owns
			continue
		}
		replies[decodeEvent(t, d).Data.ID] = d
	}
	require.Len(t, replies, 2, "ok-1 and fail-1 named the reply queue")
	assert.Equal(t, "corr-ok-1", replies["ok-1"].CorrelationId)
	assert.Equal(t, got["ok-1"].EventID, replies["ok-1"].MessageId, "one event, two destinations, one id")
	s.stopAll(c, prod)
}

// A consumer killed (SIGKILL) after a job's result is committed and
// before its event is published loses nothing: the next consumer
// publishes it. Killed after the publish and before the outbox row is
// deleted, the event comes again with the same event id.
func TestResultsSurviveKill9(t *testing.T) {
	t.Parallel()
	s := newFaultStack(t, faultOptions{})
	w := watchResults(t, s.amqpURL, "")

	s.publish(map[string][]byte{"k-1": faultJob("k-1", "")})
	c := s.consumer("w1", "LLMQ_FAILPOINT="+results.FailpointRelayBeforePublish)
	<-c.done
	require.Equal(t, 1, s.countWhere(`id = 'k-1' AND status = 'succeeded'`), "the result is committed")
	w.none(500 * time.Millisecond)

	c = s.consumer("w2", "LLMQ_FAILPOINT="+results.FailpointRelayAfterPublish)
	first := decodeEvent(t, w.next(1, c)[0])
	<-c.done
	c = s.consumer("w3")
	again := decodeEvent(t, w.next(1, c)[0])
	assert.Equal(t, "k-1", first.Data.ID)
	assert.Equal(t, first.EventID, again.EventID, "a repeat carries the same event id")
	assert.Equal(t, "job.succeeded", again.Type)
	w.none(500 * time.Millisecond)
	s.stopAll(c)
}

// On Kafka the events land on llmq.results keyed by job id, and on the
// job's own result topic when its tenant allows that topic.
func TestResultsKafkaTopics(t *testing.T) {
	t.Parallel()
	s := newFaultStack(t, faultOptions{Broker: "kafka", YAML: `
tenants:
  default:
    result_topics: [default.results]
`})
	s.publish(map[string][]byte{
		"kt-1": faultJob("kt-1", `,"result_topic":"default.results"`),
		"kt-2": faultJob("kt-2", ""),
	})
	c := s.consumer("w1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	read := func(topic string, n int) map[string]results.Event {
		r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: s.kafka, GroupID: "test-" + topic, Topic: topic,
			StartOffset: kafkago.FirstOffset, MaxWait: 100 * time.Millisecond})
		defer r.Close()
		out := map[string]results.Event{}
		for len(out) < n {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				t.Fatalf("read %s: %v (got %d of %d)\n%s", topic, err, len(out), n, c.out.tail(30))
			}
			var ev results.Event
			require.NoError(t, json.Unmarshal(m.Value, &ev))
			require.Equal(t, ev.Data.ID, string(m.Key), "keyed by job id")
			out[ev.Data.ID] = ev
		}
		return out
	}
	all := read(broker.ResultsName, 2)
	assert.Equal(t, "job.succeeded", all["kt-1"].Type)
	assert.Equal(t, "job.succeeded", all["kt-2"].Type)
	own := read("default.results", 1)
	assert.Equal(t, all["kt-1"].EventID, own["kt-1"].EventID)
	s.stopAll(c)
}

// webhookSecret is the tenants' webhook secret of the webhook scenario.
const webhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// A job's callback_url and its tenant's webhook_url each get the result
// event, signed with the tenant's secret, through the binaries; the job's
// document shows the delivery; a callback to an address the operator has
// not allowed is refused at submit.
func TestResultsWebhooks(t *testing.T) {
	t.Parallel()
	type hit struct {
		path string
		ev   client.ResultEvent
	}
	hits := make(chan hit, 10)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := client.VerifyWebhook(webhookSecret, r.Header, body, time.Now()); err != nil {
			t.Errorf("webhook %s: %v", r.URL.Path, err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		ev, err := client.ParseResultEvent(body)
		require.NoError(t, err)
		assert.Equal(t, ev.EventID, r.Header.Get("webhook-id"))
		hits <- hit{r.URL.Path, ev}
	}))
	defer receiver.Close()
	s := newFaultStack(t, faultOptions{YAML: `
webhooks:
  allow_private: true
  allow_http: true
tenants:
  acme:
    webhook_url: ` + receiver.URL + `/tenant
    webhook_secret: ` + webhookSecret + `
    webhook_hosts: [127.0.0.1]
`})
	prod, base := s.producer()
	code, body := apiCall(t, base, http.MethodPost, "/v1/jobs", "key-acme-sec-0123456789",
		faultJob("hook-1", `,"callback_url":"`+receiver.URL+`/job","metadata":{"ticket":9}`))
	require.Equal(t, http.StatusAccepted, code, "%s", body)
	code, body = apiCall(t, base, http.MethodPost, "/v1/jobs", "key-acme-sec-0123456789",
		faultJob("hook-2", `,"callback_url":"https://elsewhere.example.com/x"`))
	require.Equal(t, http.StatusBadRequest, code, "%s", body)
	assert.Contains(t, string(body), `"field":"callback_url"`)
	c := s.consumer("w1")

	got := map[string]client.ResultEvent{}
	timeout := time.After(time.Minute)
	for len(got) < 2 {
		select {
		case h := <-hits:
			got[h.path] = h.ev
		case <-timeout:
			t.Fatalf("webhooks received: %v\n%s", got, c.out.tail(40))
		}
	}
	assert.Equal(t, "hook-1", got["/job"].Data.ID)
	assert.Equal(t, got["/job"].EventID, got["/tenant"].EventID, "one event, two endpoints, one id")
	assert.Equal(t, client.StatusSucceeded, got["/job"].Data.Status)
	assert.JSONEq(t, `{"ticket":9}`, string(got["/job"].Data.Metadata))

	var view struct {
		Webhook *client.WebhookState `json:"webhook"`
	}
	s.waitFor("the job's webhook state", func() bool {
		code, body := apiCall(t, base, http.MethodGet, "/v1/jobs/hook-1", "key-acme-sec-0123456789", nil)
		require.Equal(t, http.StatusOK, code)
		require.NoError(t, json.Unmarshal(body, &view))
		return view.Webhook != nil && view.Webhook.Status == "delivered"
	}, c)
	assert.Equal(t, 1, view.Webhook.Attempts)
	var page struct {
		Jobs []struct {
			ID      string               `json:"id"`
			Webhook *client.WebhookState `json:"webhook"`
		} `json:"jobs"`
	}
	code, body = apiCall(t, base, http.MethodGet, "/v1/jobs?ids=hook-1", "key-acme-sec-0123456789", nil)
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, json.Unmarshal(body, &page))
	require.Len(t, page.Jobs, 1)
	require.NotNil(t, page.Jobs[0].Webhook, "listed documents show the delivery too")
	assert.Equal(t, "delivered", page.Jobs[0].Webhook.Status)
	s.stopAll(c, prod)
}
