package worker

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the worker's Prometheus series, registered on the registry
// the caller passes (never the global one).
type metrics struct {
	received      *prometheus.CounterVec
	jobs          *prometheus.CounterVec
	calls         *prometheus.CounterVec
	rateLimited   *prometheus.CounterVec
	tokensAdmit   *prometheus.CounterVec
	tokensSettled *prometheus.CounterVec
	estimateError *prometheus.HistogramVec
	backlog       *prometheus.GaugeVec
	inflight      *prometheus.GaugeVec
	deadLetters   *prometheus.CounterVec
	fallbacks     *prometheus.CounterVec
	storeLatency  *prometheus.HistogramVec
	latency       *prometheus.HistogramVec
	callLatency   *prometheus.HistogramVec
	heartbeats    prometheus.Counter
	storeRetries  prometheus.Counter
	tenant        *tenantMetrics
}

func newMetrics(reg prometheus.Registerer, w *Worker) (*metrics, error) {
	m := &metrics{
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmq_worker_messages_received_total",
			Help: "Job messages received, by lane."}, []string{"lane"}),
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmq_worker_jobs_total",
			Help: "Job attempts ended, by outcome (succeeded, failed, retried, dead, malformed, duplicate, deferred, lease_lost, cancelled, parked, unparked)."}, []string{"outcome"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmq_provider_calls_total",
			Help: "Provider calls, by model and HTTP status (\"error\" without a response)."}, []string{"model", "code"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmq_provider_rate_limited_total",
			Help: "Provider 429s, by model and rate-limit dimension."}, []string{"model", "dimension"}),
		tokensAdmit: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmq_tokens_admitted_total",
			Help: "Estimated input tokens admitted by the governor, by model."}, []string{"model"}),
		tokensSettled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmq_tokens_settled_total",
			Help: "Tokens (prompt + completion) the provider reported, by model."}, []string{"model"}),
		estimateError: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llmq_token_estimate_error_ratio",
			Help:    "Input-token estimate / provider prompt_tokens - 1, by model.",
			Buckets: []float64{-0.5, -0.25, -0.1, -0.05, 0, 0.05, 0.1, 0.25, 0.5, 1}}, []string{"model"}),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "llmq_worker_lane_backlog",
			Help: "Claimed jobs waiting for admission, by model and lane."}, []string{"model", "lane"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "llmq_worker_inflight_calls",
			Help: "Provider calls in flight, by model."}, []string{"model"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmq_dead_letters_total",
			Help: "Messages dead-lettered, by reason."}, []string{"reason"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmq_fallbacks_total",
			Help: "Jobs moved to a fallback model after 429s."}, []string{"from", "to"}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llmq_worker_store_seconds",
			Help: "Store round trips of the worker, by operation.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"op"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llmq_job_seconds",
			Help: "Time from delivery to stored result, by model.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 16)}, []string{"model"}),
		callLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llmq_provider_call_seconds",
			Help: "Duration of one provider call, by model and outcome (ok, rate_limited, error).", Buckets: prometheus.ExponentialBuckets(0.005, 2, 16)}, []string{"model", "outcome"}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmq_worker_lease_heartbeats_total",
			Help: "Leases extended by heartbeats."}),
		storeRetries: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmq_worker_result_store_retries_total",
			Help: "Batches of paid results whose store failed and was tried again."}),
		tenant: newTenantMetrics(w.cfg.MetricTenants),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range append(m.tenant.collectors(), m.received, m.jobs, m.calls, m.rateLimited, m.tokensAdmit, m.tokensSettled,
		m.estimateError, m.backlog, m.inflight, m.deadLetters, m.fallbacks, m.storeLatency, m.latency, m.callLatency, m.heartbeats, m.storeRetries,
		&governorCollector{w: w}) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// governorCollector exports each model governor's Snapshot at scrape time:
// concurrency limit, in-flight, controller state, bucket levels and the
// calibrated estimate error.
type governorCollector struct{ w *Worker }

var (
	descConcurrency = prometheus.NewDesc("llmq_model_concurrency_limit", "Concurrency limit of the model's governor (0 = unlimited).", []string{"model"}, nil)
	descGovInflight = prometheus.NewDesc("llmq_model_inflight", "Calls holding a concurrency slot.", []string{"model"}, nil)
	descWaiting     = prometheus.NewDesc("llmq_model_slot_waiting", "Callers waiting for a concurrency slot.", []string{"model"}, nil)
	descState       = prometheus.NewDesc("llmq_model_controller_state", "Adaptive controller state (1 for the current state).", []string{"model", "state"}, nil)
	descLevel       = prometheus.NewDesc("llmq_model_bucket_level", "Token-bucket level per admission dimension (negative = debt).", []string{"model", "dimension"}, nil)
	descEstErr      = prometheus.NewDesc("llmq_model_estimate_error", "EMA of |booked - actual| / actual tokens.", []string{"model"}, nil)
	descGranted     = prometheus.NewDesc("llmq_model_admitted_total", "Calls admitted by the governor.", []string{"model"}, nil)
)

func (c *governorCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConcurrency, descGovInflight, descWaiting, descState, descLevel, descEstErr, descGranted} {
		ch <- d
	}
}

func (c *governorCollector) Collect(ch chan<- prometheus.Metric) {
	c.w.mu.Lock()
	ds := make([]*dispatcher, 0, len(c.w.dispatchers))
	for _, d := range c.w.dispatchers {
		ds = append(ds, d)
	}
	c.w.mu.Unlock()
	for _, d := range ds {
		s := d.gov.Snapshot()
		ch <- prometheus.MustNewConstMetric(descConcurrency, prometheus.GaugeValue, float64(s.ConcurrencyLimit), d.model)
		ch <- prometheus.MustNewConstMetric(descGovInflight, prometheus.GaugeValue, float64(s.InFlight), d.model)
		ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(s.Waiting), d.model)
		if s.Controller != nil {
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, 1, d.model, s.Controller.State.String())
		}
		for dim, lvl := range s.Levels {
			ch <- prometheus.MustNewConstMetric(descLevel, prometheus.GaugeValue, lvl, d.model, dim)
		}
		ch <- prometheus.MustNewConstMetric(descEstErr, prometheus.GaugeValue, s.Calibration.EstimateError, d.model)
		ch <- prometheus.MustNewConstMetric(descGranted, prometheus.CounterValue, float64(s.Granted), d.model)
	}
}
