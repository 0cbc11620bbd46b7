package webhook

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of an attempt (label outcome of llmq_webhook_attempts_total).
const (
	OutcomeDelivered = "delivered"
	OutcomeRetry     = "retry"
	OutcomeDead      = "dead"
)

type metrics struct {
	attempts *prometheus.CounterVec
	duration prometheus.Histogram
	inFlight prometheus.Gauge
	pending  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_webhook_attempts_total",
			Help: "Webhook delivery attempts by outcome: delivered (2xx), retry (failed, tried again later), dead (failed, retry window over).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "llmq_webhook_attempt_seconds",
			Help:    "Time of one webhook attempt, from connect to the capped read of the answer.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_webhook_in_flight",
			Help: "Webhook attempts this process is sending now.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_webhook_pending",
			Help: "Webhook deliveries neither delivered nor dead (all replicas), as last counted by this process.",
		}),
	}
	for _, o := range []string{OutcomeDelivered, OutcomeRetry, OutcomeDead} {
		m.attempts.WithLabelValues(o)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.attempts, m.duration, m.inFlight, m.pending} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("webhook: register metrics: %w", err)
		}
	}
	return m, nil
}
