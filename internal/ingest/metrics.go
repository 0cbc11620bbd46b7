package ingest

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	messages *prometheus.CounterVec
	retries  *prometheus.CounterVec
	flush    prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_ingest_messages_total",
			Help: "Intake messages by verdict: created, duplicate, conflict, failed (a row failed with the reason), malformed (no readable id), handed_back.",
		}, []string{"outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_ingest_retries_total",
			Help: "Ingest operations retried after an error, by operation.",
		}, []string{"op"}),
		flush: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "llmq_ingest_batch_seconds",
			Help:    "Time to record and forward one batch of intake messages.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.messages, m.retries, m.flush} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("ingest: register metrics: %w", err)
		}
	}
	return m, nil
}
