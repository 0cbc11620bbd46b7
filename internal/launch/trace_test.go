package launch_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/launch"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/internal/testsvc"
)

const traceKey = "key-trace-test-0123456789"

// tracedStack is a producer and a consumer of one deployment (Postgres,
// a RabbitMQ vhost of its own, llmsim in process) tracing into an
// in-memory exporter.
type tracedStack struct {
	api, amqpURL, pgURL string
	spans               *tracetest.InMemoryExporter
	// ended hears every span that ends.
	ended chan struct{}
	// providerTraceparents and hookTraceparents are the traceparent
	// headers the provider and the tenant's webhook endpoint got.
	mu                                     sync.Mutex
	providerTraceparents, hookTraceparents []string
}

// endSignal tells the test that a span ended.
type endSignal struct {
	sdktrace.SpanProcessor
	ch chan struct{}
}

func (e endSignal) OnEnd(s sdktrace.ReadOnlySpan) {
	select {
	case e.ch <- struct{}{}:
	default:
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func startTracedStack(t *testing.T) *tracedStack {
	s := &tracedStack{amqpURL: testsvc.AMQPVhost(t), pgURL: testsvc.PostgresURL(t),
		spans: tracetest.NewInMemoryExporter(), ended: make(chan struct{}, 1)}
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.hookTraceparents = append(s.hookTraceparents, r.Header.Get("traceparent"))
		s.mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(s.spans),
		sdktrace.WithSpanProcessor(endSignal{SpanProcessor: sdktrace.NewSimpleSpanProcessor(tracetest.NewNoopExporter()), ch: s.ended}))
	cfg, err := config.Parse([]byte(`
broker: rabbitmq
http_addr: 127.0.0.1:0
metrics_addr: 127.0.0.1:0
api_keys: {`+traceKey+`: default}
provider: {base_url: "http://llmsim.test/v1", api_key: sk-test, timeout: 10s}
models:
  qwen-plus: {rpm: 60000, tpm: 100000000}
worker: {id: trace-test, lease: 5s, retry_base: 50ms, retry_max: 500ms, shutdown_grace: 5s}
webhooks: {allow_private: true, allow_http: true}
tenants:
  default: {webhook_url: "`+hook.URL+`/hook", webhook_secret: whsec_MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE=}
`), func(k string) (string, bool) {
		v, ok := map[string]string{"LLMQ_POSTGRES_URL": s.pgURL, "LLMQ_AMQP_URL": s.amqpURL}[k]
		return v, ok
	})
	require.NoError(t, err)
	llmsim, err := sim.New(sim.Config{Models: map[string]sim.ModelConfig{"qwen-plus": {}}})
	require.NoError(t, err)
	simRT := llmsim.Transport()
	provider := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		s.mu.Lock()
		s.providerTraceparents = append(s.providerTraceparents, r.Header.Get("traceparent"))
		s.mu.Unlock()
		return simRT.RoundTrip(r)
	})

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	apiReady, consumerReady := make(chan string, 1), make(chan string, 1)
	wg.Go(func() {
		errs <- launch.Producer(ctx, cfg, launch.Options{TracerProvider: tp, Ready: func(a string) { apiReady <- a }})
	})
	wg.Go(func() {
		errs <- launch.Consumer(ctx, cfg, launch.Options{TracerProvider: tp, ProviderTransport: provider,
			Ready: func(a string) { consumerReady <- a }})
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		llmsim.Close()
		close(errs)
		for err := range errs {
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("process: %v", err)
			}
		}
		require.NoError(t, tp.Shutdown(context.Background()))
	})
	timeout := time.After(time.Minute)
	for range 2 {
		select {
		case a := <-apiReady:
			s.api = "http://" + a
		case <-consumerReady:
		case err := <-errs:
			t.Fatalf("a process stopped before it served: %v", err)
		case <-timeout:
			t.Fatal("producer and consumer did not serve within a minute")
		}
	}
	return s
}

// waitVisible waits until GET answers the job (200), failing on any answer
// but 404 and after a minute.
func (s *tracedStack) waitVisible(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		req, err := http.NewRequest(http.MethodGet, s.api+"/v1/jobs/"+id, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+traceKey)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("job %s not visible within a minute", id)
}

// waitSucceeded long-polls the job until it is terminal and asserts it
// succeeded.
func (s *tracedStack) waitSucceeded(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		body := s.call(t, http.MethodGet, "/v1/jobs/"+id+"?wait=20s", "", nil, http.StatusOK)
		if strings.Contains(body, `"status":"succeeded"`) {
			return
		}
		require.NotRegexp(t, `"status":"(failed|dead|cancelled)"`, body)
	}
	t.Fatalf("job %s did not succeed within a minute", id)
}

func (s *tracedStack) call(t *testing.T, method, path, body string, header http.Header, want int) string {
	t.Helper()
	req, err := http.NewRequest(method, s.api+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+traceKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, want, resp.StatusCode, "%s", data)
	return string(data)
}

// spansOf waits until the trace holds a span of each name (the relay's
// and the attempt's end after the result is stored) and returns the
// trace's spans by name, each name once.
func (s *tracedStack) spansOf(t *testing.T, traceID trace.TraceID, names ...string) map[string]tracetest.SpanStub {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		got := map[string]tracetest.SpanStub{}
		for _, sp := range s.spans.GetSpans() {
			if sp.SpanContext.TraceID() == traceID {
				_, dup := got[sp.Name]
				require.False(t, dup, "span %s twice in the trace", sp.Name)
				got[sp.Name] = sp
			}
		}
		missing := false
		for _, n := range names {
			if _, ok := got[n]; !ok {
				missing = true
			}
		}
		if !missing {
			return got
		}
		select {
		case <-s.ended:
		case <-timeout:
			t.Fatalf("trace %s has spans %v, want %v", traceID, keys(got), names)
		}
	}
}

func keys(m map[string]tracetest.SpanStub) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func attrOf(sp tracetest.SpanStub, key attribute.Key) attribute.Value {
	for _, a := range sp.Attributes {
		if a.Key == key {
			return a.Value
		}
	}
	return attribute.Value{}
}

// assertChild asserts that child is parent's child, both in the trace.
func assertChild(t *testing.T, parent, child tracetest.SpanStub) {
	t.Helper()
	assert.Equal(t, parent.SpanContext.TraceID(), child.SpanContext.TraceID(), "%s in the trace of %s", child.Name, parent.Name)
	assert.Equal(t, parent.SpanContext.SpanID(), child.Parent.SpanID(), "%s is a child of %s", child.Name, parent.Name)
}

// assertAttempt asserts the consumer's side of one job's trace: the
// attempt under parent (the submit or ingest span), its steps under it,
// and the provider call's context sent as the request's traceparent.
func (s *tracedStack) assertAttempt(t *testing.T, got map[string]tracetest.SpanStub, parent tracetest.SpanStub, id string) {
	t.Helper()
	attempt := got[telemetry.SpanJob]
	assertChild(t, parent, attempt)
	assert.Equal(t, trace.SpanKindConsumer, attempt.SpanKind)
	assert.Equal(t, id, attrOf(attempt, telemetry.KeyJobID).AsString())
	assert.Equal(t, "default", attrOf(attempt, telemetry.KeyTenant).AsString())
	assert.Equal(t, "qwen-plus", attrOf(attempt, telemetry.KeyModel).AsString())
	assert.Equal(t, int64(1), attrOf(attempt, telemetry.KeyAttempt).AsInt64())
	assert.Equal(t, "succeeded", attrOf(attempt, telemetry.KeyOutcome).AsString())
	for _, step := range []string{telemetry.SpanClaim, telemetry.SpanAdmit, telemetry.SpanComplete} {
		assertChild(t, attempt, got[step])
	}
	call := got[telemetry.CallSpanName("qwen-plus")]
	assertChild(t, attempt, call)
	assert.Equal(t, trace.SpanKindClient, call.SpanKind)
	assert.Equal(t, int64(200), attrOf(call, telemetry.KeyHTTPStatus).AsInt64())
	assert.Equal(t, id, attrOf(call, telemetry.KeyJobID).AsString())
	assert.Positive(t, attrOf(call, telemetry.KeyGenAIInputTokens).AsInt64())
	result := got[telemetry.SpanResult]
	assertChild(t, parent, result)
	assert.Equal(t, id, attrOf(result, telemetry.KeyJobID).AsString())
	assert.Equal(t, "succeeded", attrOf(result, telemetry.KeyStatus).AsString())
	hook := got[telemetry.SpanWebhook]
	assertChild(t, parent, hook)
	assert.Equal(t, trace.SpanKindClient, hook.SpanKind)
	assert.Equal(t, int64(http.StatusOK), attrOf(hook, telemetry.KeyHTTPStatus).AsInt64())
	s.mu.Lock()
	defer s.mu.Unlock()
	assert.Contains(t, s.providerTraceparents, traceparentOf(call), "the provider request carries the call span's context")
	assert.Contains(t, s.hookTraceparents, traceparentOf(hook), "the webhook request carries its span's context")
}

// storedTraceparent is the traceparent column of a job's row.
func (s *tracedStack) storedTraceparent(t *testing.T, id string) string {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), s.pgURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var tp *string
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT traceparent FROM jobs WHERE tenant = 'default' AND id = $1`, id).Scan(&tp))
	require.NotNil(t, tp, "job %s has no stored traceparent", id)
	return *tp
}

func traceparentOf(sp tracetest.SpanStub) string {
	return "00-" + sp.SpanContext.TraceID().String() + "-" + sp.SpanContext.SpanID().String() + "-01"
}

// One job's trace, from POST /v1/jobs with a caller's traceparent to its
// stored result, and one published straight onto the intake with a
// traceparent AMQP header: every span in the caller's trace, under the
// expected parent, through real Postgres and RabbitMQ.
func TestTraceOfOneJob(t *testing.T) {
	s := startTracedStack(t)
	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	traceID, err := trace.TraceIDFromHex(callerTrace)
	require.NoError(t, err)
	job := func(id string) string {
		return `{"id":"` + id + `","model":"qwen-plus","request":{"messages":[{"role":"user","content":"trace me"}]}}`
	}
	attemptNames := []string{telemetry.SpanJob, telemetry.SpanClaim, telemetry.SpanAdmit, telemetry.SpanComplete,
		telemetry.CallSpanName("qwen-plus"), telemetry.SpanResult, telemetry.SpanWebhook}

	t.Run("http", func(t *testing.T) {
		h := http.Header{"Traceparent": {"00-" + callerTrace + "-" + callerSpan + "-01"}, "Tracestate": {"vendor=x"}}
		s.call(t, http.MethodPost, "/v1/jobs", job("traced-http"), h, http.StatusAccepted)
		s.waitSucceeded(t, "traced-http")

		got := s.spansOf(t, traceID, append(attemptNames, telemetry.SpanSubmit)...)
		submit := got[telemetry.SpanSubmit]
		assert.Equal(t, trace.SpanKindServer, submit.SpanKind)
		assert.Equal(t, callerSpan, submit.Parent.SpanID().String(), "the submit span is the caller's child")
		assert.True(t, submit.Parent.IsRemote())
		assert.Equal(t, "vendor=x", submit.SpanContext.TraceState().String())
		assert.Equal(t, "traced-http", attrOf(submit, telemetry.KeyJobID).AsString())
		assert.Equal(t, int64(http.StatusAccepted), attrOf(submit, telemetry.KeyHTTPStatus).AsInt64())
		assert.Equal(t, traceparentOf(submit), s.storedTraceparent(t, "traced-http"), "the row carries the submit span")
		s.assertAttempt(t, got, submit, "traced-http")
	})

	t.Run("amqp header", func(t *testing.T) {
		const amqpTrace = "5bf92f3577b34da6a3ce929d0e0e4737"
		amqpTraceID, err := trace.TraceIDFromHex(amqpTrace)
		require.NoError(t, err)
		conn, err := amqp.Dial(s.amqpURL)
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, ch.Confirm(false))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, broker.JobsExchange, "normal", true, false, amqp.Publishing{
			MessageId: "traced-amqp", ContentType: "application/json", DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{"traceparent": "00-" + amqpTrace + "-" + callerSpan + "-01"},
			Body:    []byte(job("traced-amqp")),
		})
		require.NoError(t, err)
		acked, err := conf.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, acked, "the broker confirmed the intake message")
		s.spansOf(t, amqpTraceID, telemetry.SpanIngest) // the job is read
		// A job the consumer runs straight off the intake has a row within
		// worker.store_delay of its read (docs/design.md#write-once), not
		// at the ingest span's end.
		s.waitVisible(t, "traced-amqp")
		s.waitSucceeded(t, "traced-amqp")

		got := s.spansOf(t, amqpTraceID, append(attemptNames, telemetry.SpanIngest)...)
		ingest := got[telemetry.SpanIngest]
		assert.Equal(t, trace.SpanKindConsumer, ingest.SpanKind)
		assert.Equal(t, callerSpan, ingest.Parent.SpanID().String(), "the ingest span is the publisher's child")
		assert.Equal(t, "traced-amqp", attrOf(ingest, telemetry.KeyJobID).AsString())
		assert.Equal(t, "recorded", attrOf(ingest, telemetry.KeyOutcome).AsString())
		assert.Equal(t, traceparentOf(ingest), s.storedTraceparent(t, "traced-amqp"), "the row carries the ingest span")
		s.assertAttempt(t, got, ingest, "traced-amqp")
	})
}
