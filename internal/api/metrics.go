package api

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/job"
)

// metrics are the API's Prometheus series, registered on the server's own
// registry.
type metrics struct {
	requests  *prometheus.CounterVec   // route, code
	latency   *prometheus.HistogramVec // route
	submitted *prometheus.CounterVec   // result
	backlog   *prometheus.GaugeVec     // lane
	drainRate prometheus.Gauge
	state     prometheus.Gauge
	// tenantState is per tenant with a backlog_limit only: the label's
	// values are bounded by the configuration.
	tenantState *prometheus.GaugeVec // tenant
	longPolls   prometheus.Gauge
}

// Submission results counted by llmq_api_jobs_submitted_total.
const (
	resultCreated      = "created"
	resultExisting     = "existing"
	resultInvalid      = "invalid"
	resultBackpressure = "backpressure"
	resultError        = "error"
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_api_requests_total", Help: "HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmq_api_request_duration_seconds", Help: "HTTP request latency by route.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"route"}),
		submitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_api_jobs_submitted_total", Help: "Submitted jobs by result (created, existing, invalid, backpressure, error).",
		}, []string{"result"}),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_backlog_jobs", Help: "Backlog per lane as the API last measured it.",
		}, []string{"lane"}),
		drainRate: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_drain_rate_jobs_per_second", Help: "Jobs finished per second over the last minute.",
		}),
		state: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_backpressure_state", Help: "Back-pressure state: 0 ok, 1 throttled, 2 full.",
		}),
		tenantState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_tenant_backpressure_state", Help: "Back-pressure state of each tenant with a backlog_limit, against it: 0 ok, 1 throttled, 2 full.",
		}, []string{"tenant"}),
		longPolls: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_api_long_polls_waiting", Help: "GET /v1/jobs/{id}?wait= requests waiting for their job to finish.",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.submitted, m.backlog, m.drainRate, m.state, m.tenantState, m.longPolls} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("api: register metrics: %w", err)
		}
	}
	for _, r := range []string{resultCreated, resultExisting, resultInvalid, resultBackpressure, resultError} {
		m.submitted.WithLabelValues(r)
	}
	return m, nil
}

func (m *metrics) observeStatus(st Status) {
	for _, lane := range job.Priorities {
		m.backlog.WithLabelValues(string(lane)).Set(float64(st.Backlog[lane]))
	}
	m.drainRate.Set(st.DrainRate)
	m.state.Set(stateValue(st.State))
	for tenant, state := range st.TenantStates {
		m.tenantState.WithLabelValues(tenant).Set(stateValue(state))
	}
}

// stateValue is a back-pressure state as a gauge value.
func stateValue(state string) float64 {
	switch state {
	case StateThrottled:
		return 1
	case StateFull:
		return 2
	}
	return 0
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection (a long-poll
// extends its write deadline).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (s *Server) instrument(route string, h http.Handler) http.Handler {
	latency := s.metrics.latency.WithLabelValues(route)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.code == 0 {
			rec.code = http.StatusOK
		}
		latency.Observe(time.Since(start).Seconds())
		s.metrics.requests.WithLabelValues(route, strconv.Itoa(rec.code)).Inc()
	})
}
