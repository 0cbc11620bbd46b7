package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/finished"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
)

// Store is what the API needs from Postgres; *store.Store implements it.
type Store interface {
	InsertBatch(ctx context.Context, jobs []job.Job) ([]store.BatchInsert, error)
	Unsubmit(ctx context.Context, keys []job.Key) ([]job.Key, error)
	MarkUnenqueued(ctx context.Context, key job.Key) error
	MarkEnqueued(ctx context.Context, keys []job.Key) error
	Get(ctx context.Context, key job.Key) (store.Record, error)
	Resubmitted(ctx context.Context, key job.Key) (store.Record, error)
	GetMany(ctx context.Context, tenant string, ids []string) ([]store.Record, error)
	Feed(ctx context.Context, f store.FeedFilter) ([]store.Record, string, error)
	Ahead(ctx context.Context, lane job.Priority, createdAt time.Time, id string) (int64, error)
	List(ctx context.Context, f store.ListFilter) ([]store.Record, string, error)
	Cancel(ctx context.Context, key job.Key) (store.Record, error)
	ReplayDeadLetter(ctx context.Context, tenant string, id int64, replacement *job.Job) (store.Replayed, error)
	TenantBacklog(ctx context.Context) (map[string]map[job.Priority]int64, error)
	DrainRate(ctx context.Context, window time.Duration) (float64, error)
	FindDeadLetters(ctx context.Context, f store.DeadLetterFilter) ([]store.DeadLetterRow, string, error)
	CountDeadLetters(ctx context.Context, f store.DeadLetterFilter) (int64, error)
	AttemptLog(ctx context.Context, key job.Key) ([]store.AttemptLogEntry, error)
	GetDeadLetter(ctx context.Context, tenant string, id int64) (store.DeadLetterRow, error)
	TakeDeadLetter(ctx context.Context, tenant string, id int64) (store.DeadLetterRow, error)
	Ping(ctx context.Context) error
	Usage(ctx context.Context, f store.UsageFilter) ([]store.UsageRow, error)
}

var _ Store = (*store.Store)(nil)

// Finished is what long-polls and expected starts need from the process's
// job-finished listener; *finished.Listener implements it.
type Finished interface {
	// Register starts waiting for key's finish (see finished.Waiter).
	Register(key job.Key) *finished.Waiter
	// DrainRate is lane's jobs finished per second over the last minute.
	DrainRate(lane job.Priority) float64
	// TenantDrainRates is each tenant's jobs finished per second over the
	// last minute, for the tenants that finished one.
	TenantDrainRates() map[string]float64
}

var _ Finished = (*finished.Listener)(nil)

// Config builds a Server. Store, Publisher and Inspector are required.
type Config struct {
	Store     Store
	Publisher broker.Publisher
	Inspector broker.Inspector
	// APIKeys maps bearer keys to tenants; empty means loopback-only,
	// unauthenticated, tenant "default" (see CheckListenAddr).
	APIKeys config.APIKeys
	// AdminKeys act for every tenant (config admin_keys).
	AdminKeys    []config.Secret
	Backpressure config.Backpressure
	// BacklogLimits is each tenant's tenants.<name>.backlog_limit: at it
	// the tenant's submissions get 429 whatever the global backlog.
	BacklogLimits map[string]int64
	Limits        config.Limits
	// Finished wakes long-polls (GET /v1/jobs/{id}?wait=) and measures the
	// lanes' drain rates for expected starts; without it ?wait= answers at
	// once and no document has an expected start.
	Finished Finished
	// Models are the configured models; when non-empty a job naming another
	// model (or fallback model) is refused with 400.
	Models map[string]config.Model
	// Destinations judges a job's callback_url and result_topic against
	// the tenants' configuration (results.NewPolicy); a refusal is a 400
	// naming the field. Default: the policy of no tenants, which refuses
	// every callback_url and result_topic.
	Destinations DestinationPolicy
	// BrokerTenants are the tenants with broker_users: their raw publishes
	// count only from their own broker identity, which a replay of their
	// message dead letters cannot give over RabbitMQ (replayMessage).
	BrokerTenants map[string]bool
	// MaxBatchItems caps POST /v1/jobs:batch (default 1000).
	MaxBatchItems int
	// PublishTimeout bounds one broker publish with its confirm (default 10s).
	PublishTimeout time.Duration
	// CommitFlushers is how many group-commit transactions may be in flight
	// at once (default 4); each holds one Postgres connection.
	CommitFlushers int
	// MaxCommitBatch caps the jobs of one group commit (default 256).
	MaxCommitBatch int
	Logger         *slog.Logger
	// Registry receives the API's metrics and is served on /metrics
	// (default: a new registry).
	Registry *prometheus.Registry
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Failpoint is a TEST-ONLY hook called at FailpointReplayAfterCommit;
	// nil in production.
	Failpoint func(name string)
	// Tracer traces submissions (trace.go); nil is tracing off.
	Tracer *telemetry.Tracer
}

// DestinationPolicy judges where a job's result may go; *results.Policy
// implements it.
type DestinationPolicy interface {
	// Check returns nil or a *job.ValidationError naming the field.
	Check(j job.Job) error
}

var _ DestinationPolicy = (*results.Policy)(nil)

// FailpointReplayAfterCommit is passed between a DLQ replay's commit (the
// job queued, its dead letter removed) and the publish of its message: the
// fault suite kills the producer there to show the reconciler completes
// the replay.
const FailpointReplayAfterCommit = "replay_after_commit"

// Server is the producer's HTTP API.
type Server struct {
	store    Store
	finished Finished
	pub      broker.Publisher
	insp     broker.Inspector
	auth     *authenticator
	limits   job.Limits
	models   map[string]config.Model
	dests    DestinationPolicy
	// brokerTenants: Config.BrokerTenants.
	brokerTenants map[string]bool
	maxBody       int64
	// maxBatchBody caps a batch request body.
	maxBatchBody   int64
	maxBatchItems  int
	publishTimeout time.Duration
	failpoint      func(string)
	tracer         *telemetry.Tracer
	log            *slog.Logger
	now            func() time.Time
	reg            *prometheus.Registry
	metrics        *metrics
	mon            *monitor
	hub            *overviewHub
	commit         *committer
	handler        http.Handler
	// draining is closed when Run returns: long-polls answer at once
	// rather than hold the HTTP server's graceful shutdown.
	draining  chan struct{}
	drainOnce sync.Once
}

// New checks cfg and builds the server. Call Run to keep the back-pressure
// status fresh; until the first refresh the state is "ok" with no backlog.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Publisher == nil || cfg.Inspector == nil {
		return nil, errors.New("api: Store, Publisher and Inspector are required")
	}
	bp := cfg.Backpressure
	if bp.HardLimit <= 0 {
		bp.HardLimit = 50000
	}
	if bp.SoftLimit <= 0 || bp.SoftLimit > bp.HardLimit {
		bp.SoftLimit = bp.HardLimit
	}
	if bp.StatusInterval <= 0 {
		bp.StatusInterval = 5 * time.Second
	}
	if cfg.MaxBatchItems <= 0 {
		cfg.MaxBatchItems = 1000
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 10 * time.Second
	}
	if cfg.CommitFlushers <= 0 {
		cfg.CommitFlushers = 4
	}
	if cfg.MaxCommitBatch <= 0 {
		cfg.MaxCommitBatch = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Destinations == nil {
		cfg.Destinations = results.NewPolicy(config.Config{})
	}
	lim := cfg.Limits.Job().WithDefaults()
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	s := &Server{
		store:    cfg.Store,
		finished: cfg.Finished,
		pub:      cfg.Publisher,
		insp:     cfg.Inspector,
		auth:     newAuthenticator(cfg.APIKeys, cfg.AdminKeys),
		limits:   lim,
		models:   cfg.Models,
		dests:    cfg.Destinations, brokerTenants: cfg.BrokerTenants,
		maxBody:        int64(lim.MaxPayloadBytes),
		maxBatchBody:   int64(lim.MaxPayloadBytes) * 16,
		maxBatchItems:  cfg.MaxBatchItems,
		publishTimeout: cfg.PublishTimeout,
		failpoint:      cfg.Failpoint,
		tracer:         cfg.Tracer,
		log:            cfg.Logger,
		now:            cfg.Now,
		reg:            cfg.Registry,
		metrics:        m,
		draining:       make(chan struct{}),
	}
	s.mon = &monitor{
		store: cfg.Store, inspector: cfg.Inspector, pub: cfg.Publisher,
		soft: bp.SoftLimit, hard: bp.HardLimit, interval: bp.StatusInterval,
		now: cfg.Now, log: cfg.Logger, metrics: m,
		limits: cfg.BacklogLimits, tenants: newTenantSnapshot(),
		status: Status{
			State:     StateOK,
			Backlog:   map[job.Priority]int64{job.PriorityHigh: 0, job.PriorityNormal: 0, job.PriorityLow: 0},
			SoftLimit: bp.SoftLimit, HardLimit: bp.HardLimit,
		},
	}
	if cfg.Finished != nil {
		s.mon.finishRate = func() float64 {
			var total float64
			for _, lane := range job.Priorities {
				total += cfg.Finished.DrainRate(lane)
			}
			return total
		}
		s.mon.tenantRates = cfg.Finished.TenantDrainRates
	}
	s.hub = newOverviewHub(cfg.Store, cfg.Now)
	s.commit = &committer{
		store: cfg.Store, pub: cfg.Publisher, timeout: cfg.PublishTimeout,
		flushers: cfg.CommitFlushers, maxBatch: cfg.MaxCommitBatch,
	}
	s.handler = s.mux()
	return s, nil
}

// Handler is the API's http.Handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Run keeps the back-pressure status fresh (about every second) and
// publishes it on llmq.status every status interval and on every change of
// state, until ctx ends; then the long-polls waiting answer.
func (s *Server) Run(ctx context.Context) {
	defer s.drainOnce.Do(func() { close(s.draining) })
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.hub.run(ctx, func(err error) { s.log.Warn("read replica snapshots", "error", err) }) })
	s.mon.run(ctx)
}

// Close waits for in-flight group commits to finish. Call it after the
// HTTP server has shut down (no request can start a new one).
func (s *Server) Close() { s.commit.wait() }

// RefreshStatus measures the backlog now and returns the new status (Run
// does this every second; tests and tools call it to skip the wait).
func (s *Server) RefreshStatus(ctx context.Context) (Status, error) {
	st, changed, err := s.mon.refresh(ctx, true)
	if err == nil && changed {
		s.mon.publish(ctx, st)
	}
	return st, err
}

// Status returns the cached back-pressure status.
func (s *Server) Status() Status { return s.mon.snapshot() }

// CheckListenAddr refuses to serve unauthenticated on a non-loopback
// address: with no API keys configured, addr must be a loopback host.
func CheckListenAddr(addr string, keys config.APIKeys) error {
	if len(keys) > 0 {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("api: listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("api: no api_keys configured: refusing to serve unauthenticated on non-loopback address %q (set LLMQ_API_KEYS or listen on 127.0.0.1)", addr)
}

// route is one registration of the API's mux. routes is the table that
// Handler serves and that api/openapi.yaml is tested against.
type route struct {
	// pattern is the http.ServeMux pattern, "METHOD /path"; "/" is the
	// catch-all that answers every other request 404.
	pattern string
	// name labels llmq_api_requests_total; "" leaves the route out of it.
	name    string
	handler http.Handler
}

func (s *Server) routes() []route {
	auth := s.authenticated
	return []route{
		{"POST /v1/jobs", "submit", s.traced(telemetry.SpanSubmit, auth(s.handleSubmit))},
		{"POST /v1/jobs:batch", "submit_batch", s.traced(telemetry.SpanSubmitBatch, auth(s.handleSubmitBatch))},
		{"GET /v1/jobs", "list", auth(s.handleList)},
		{"GET /v1/jobs/{id}", "get", auth(s.handleGet)},
		{"GET /v1/jobs/{id}/request", "get_request", auth(s.handleGetRequest)},
		{"POST /v1/jobs/{id}/cancel", "cancel", auth(s.handleCancel)},
		{"GET /v1/status", "status", auth(s.handleStatus)},
		{"GET /v1/dlq", "dlq_list", auth(s.handleDLQList)},
		{"POST /v1/dlq/{id}/replay", "dlq_replay", s.traced(telemetry.SpanReplay, auth(s.handleDLQReplay))},
		{"POST /v1/dlq/replay", "dlq_replay_filtered", s.traced(telemetry.SpanReplayFiltered, auth(s.handleDLQReplayFiltered))},
		{"GET /v1/usage", "usage", auth(s.handleUsage)},
		{"GET /v1/overview", "overview", auth(s.handleOverview)},
		{"GET /v1/overview/stream", "overview_stream", auth(s.handleOverviewStream)},
		{"GET /v1/openapi.yaml", "openapi", http.HandlerFunc(handleOpenAPI)},
		{"GET /v1/schemas/{name}", "schemas", http.HandlerFunc(handleSchema)},
		{"GET /metrics", "", s.adminOnly(promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))},
		{"GET /healthz", "healthz", http.HandlerFunc(s.handleHealthz)},
		{"GET /readyz", "readyz", http.HandlerFunc(s.handleReadyz)},
		{"/", "not_found", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeError(w, apiError(http.StatusNotFound, CodeNotFound, "no such route"))
		})},
	}
}

func (s *Server) mux() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		h := rt.handler
		if rt.name != "" {
			h = s.instrument(rt.name, h)
		}
		mux.Handle(rt.pattern, h)
	}
	return mux
}

// authenticated serves h to every key, passing the tenant the request acts
// on (actingTenant) and storing the key's principal in the context.
func (s *Server) authenticated(h func(w http.ResponseWriter, r *http.Request, tenant string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, ok := s.auth.principal(r)
		if !ok {
			writeUnauthorized(w)
			return
		}
		tenant, e := actingTenant(r, who)
		if e != nil {
			writeError(w, e)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, who)), tenant)
	})
}

func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	checks := map[string]string{"postgres": "ok", "broker": "ok"}
	ready := true
	if err := s.store.Ping(ctx); err != nil {
		checks["postgres"] = "unavailable"
		ready = false
		s.log.Warn("readiness: postgres", "error", err)
	}
	if _, err := s.insp.Depth(ctx, job.PriorityNormal); err != nil {
		checks["broker"] = "unavailable"
		ready = false
		s.log.Warn("readiness: broker", "error", err)
	}
	status := http.StatusOK
	if !ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, map[string]any{"ready": ready, "checks": checks})
}
