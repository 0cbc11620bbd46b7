package quota

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/config"
)

// metrics are the coordinator's Prometheus series, registered on the
// registerer passed with WithRegisterer (none by default).
type metrics struct {
	share     *prometheus.GaugeVec // applied absolute limit per model and dimension
	members   *prometheus.GaugeVec
	renewals  prometheus.Counter
	round     prometheus.Histogram
	fallback  prometheus.Gauge
	penalties *prometheus.CounterVec
	adopted   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		share: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_quota_share",
			Help: "This replica's applied share of a model's limit, in the dimension's unit (rpm, tpm, rps, tps, concurrency).",
		}, []string{"model", "dimension"}),
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_quota_members",
			Help: "Live replicas sharing a model's quota, as of the last round.",
		}, []string{"model"}),
		renewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_quota_renewals_total",
			Help: "Successful coordination rounds (lease renewals).",
		}),
		round: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "llmq_quota_round_seconds",
			Help:    "Duration of one coordination round against Postgres.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1},
		}),
		fallback: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_quota_fallback",
			Help: "1 while Postgres is unreachable and the replica runs on its fallback share.",
		}),
		penalties: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_quota_penalties_total",
			Help: "429 penalties shared with (sent) or taken from (received) other replicas, and sent ones lost (dropped).",
		}, []string{"direction"}),
		adopted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_quota_learned_adopted_total",
			Help: "Models whose governor started from another replica's calibration or rate cap when this replica joined.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.share, m.members, m.renewals, m.round, m.fallback, m.penalties, m.adopted)
	}
	return m
}

func (m *metrics) setShare(model string, cfg config.Model, s Share) {
	l := struct{ RPM, TPM, RPS, TPS, MaxConcurrency float64 }{
		cfg.RPM * s.Requests, cfg.TPM * s.Tokens, cfg.RPS * s.Requests, cfg.TPS * s.Tokens,
		float64(cfg.MaxConcurrency) * s.Requests,
	}
	m.share.WithLabelValues(model, "rpm").Set(l.RPM)
	m.share.WithLabelValues(model, "tpm").Set(l.TPM)
	m.share.WithLabelValues(model, "rps").Set(l.RPS)
	m.share.WithLabelValues(model, "tps").Set(l.TPS)
	m.share.WithLabelValues(model, "concurrency").Set(l.MaxConcurrency)
}
