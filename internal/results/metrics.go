package results

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the relay's.
type Metrics struct {
	published  prometheus.Counter
	webhooks   prometheus.Counter
	unroutable prometheus.Counter
	errors     prometheus.Counter
	putOff     prometheus.Counter
	givenUp    prometheus.Counter
	slimmed    prometheus.Counter
	pending    prometheus.Gauge
	oldest     prometheus.Gauge
}

// NewMetrics registers the relay's metrics with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmq_result_events_published_total",
			Help: "Result events published (llmq.results, reply queues, result topics); a repeat after a crash counts again."}),
		webhooks: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmq_result_webhooks_queued_total",
			Help: "Webhook deliveries stored for the webhook dispatcher."}),
		unroutable: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmq_result_replies_unroutable_total",
			Help: "Result events whose reply_to queue did not exist (that copy is dropped)."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmq_result_relay_errors_total",
			Help: "Relay rounds that failed (broker or Postgres unavailable) and were retried."}),
		putOff: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmq_result_events_put_off_total",
			Help: "Result events the broker refused on their own (a full reply queue, an event too large), tried again after a backoff."}),
		givenUp: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmq_result_events_given_up_total",
			Help: "Result events the broker refused too often: their broker copies are dropped (the result is in Postgres, webhooks go out)."}),
		slimmed: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmq_result_events_slimmed_total",
			Help: "Result events a broker took only without their response (too large for a Kafka message); GET /v1/jobs/{id} has it."}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "llmq_result_outbox_pending",
			Help: "Result events committed and not yet published."}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{Name: "llmq_result_outbox_oldest_seconds",
			Help: "Age of the oldest result event not yet published."}),
	}
	if reg != nil {
		reg.MustRegister(m.published, m.webhooks, m.unroutable, m.errors, m.putOff, m.givenUp, m.slimmed, m.pending, m.oldest)
	}
	return m
}
