package sim

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxBody bounds a chat request body.
const maxBody = 8 << 20

// Simulator is the simulated provider: an http.Handler serving
//
//	POST /v1/chat/completions, POST /compatible-mode/v1/chat/completions
//	POST /v1/embeddings,       POST /compatible-mode/v1/embeddings
//	/v1/files, /v1/batches (the Batch API, batchapi.go)
//	POST /v1/audio/transcriptions (audio.go)
//	POST /api/v1/services/aigc/…, GET /api/v1/tasks/{id} (tasks.go)
//	PUT  /admin/models/{model}   GET /admin/models   GET /admin/stats
//	GET  /metrics                GET /healthz
//
// It is safe for concurrent use. Close releases requests that hang or wait.
type Simulator struct {
	cfg      Config // models live in s.models
	clock    Clock
	logger   *slog.Logger
	start    time.Time
	faults   *faulter
	mux      *http.ServeMux
	registry *prometheus.Registry
	ids      atomic.Uint64

	mu     sync.RWMutex
	models map[string]*model
	batch  *batchAPI

	tasks tasks // asynchronous tasks (tasks.go)

	closeOnce sync.Once
	closed    chan struct{}
}

// Option configures a Simulator.
type Option func(*Simulator)

// WithClock sets the clock (default: the time package, virtual under testing/synctest).
func WithClock(c Clock) Option { return func(s *Simulator) { s.clock = c } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(s *Simulator) { s.logger = l } }

// New builds a simulator from cfg (defaults applied, then validated).
func New(cfg Config, opts ...Option) (*Simulator, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("simulator config: %w", err)
	}
	s := &Simulator{
		cfg:    cfg,
		clock:  realClock{},
		logger: slog.New(slog.DiscardHandler),
		faults: newFaulter(cfg.Faults),
		models: make(map[string]*model, len(cfg.Models)),
		closed: make(chan struct{}),
		batch:  newBatchAPI(cfg.Batch),
		tasks:  tasks{byID: map[string]*simTask{}, peak: map[string]int64{}, overruns: map[string]int64{}, polls: map[string]int64{}},
	}
	for _, o := range opts {
		o(s)
	}
	s.start = s.clock.Now()
	for name, m := range cfg.Models {
		s.models[name] = s.newModel(name, m)
	}
	s.registry = prometheus.NewRegistry()
	s.registry.MustRegister(newCollector(s))
	s.routes()
	return s, nil
}

func (s *Simulator) routes() {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	mux.HandleFunc("POST /compatible-mode/v1/chat/completions", s.handleChat)
	mux.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	mux.HandleFunc("POST /compatible-mode/v1/embeddings", s.handleEmbeddings)
	mux.HandleFunc("POST /v1/audio/transcriptions", s.handleAudio)
	mux.HandleFunc("POST /api/v1/services/aigc/{path...}", s.handleTaskSubmit)
	mux.HandleFunc("GET /api/v1/tasks/{id}", s.handleTaskGet)
	mux.HandleFunc("POST /compatible-mode/v1/audio/transcriptions", s.handleAudio)
	for _, path := range []string{"/v1/chat/completions", "/compatible-mode/v1/chat/completions", "/v1/embeddings", "/compatible-mode/v1/embeddings",
		"/v1/audio/transcriptions", "/compatible-mode/v1/audio/transcriptions"} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", r.Method+" is not allowed; use POST")
		})
	}
	s.batchRoutes(mux)
	mux.HandleFunc("PUT /admin/models/{model}", s.authed(s.handlePutModel))
	mux.HandleFunc("GET /admin/models", s.authed(s.handleGetModels))
	mux.HandleFunc("GET /admin/stats", s.authed(s.handleStats))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "no route for "+r.Method+" "+r.URL.Path)
	})
	s.mux = mux
}

func (s *Simulator) newModel(name string, m ModelConfig) *model {
	md := &model{name: name, cfg: s.resolve(m)}
	md.c.startSec = s.start.UnixNano() / second
	return md
}

// resolve fills a model's defaults and the simulator-wide latency and output.
func (s *Simulator) resolve(m ModelConfig) ModelConfig {
	m = m.WithDefaults()
	if m.Latency == nil {
		l := s.cfg.Latency
		m.Latency = &l
	}
	if m.Output == nil || *m.Output == (OutputMix{}) {
		o := s.cfg.Output
		m.Output = &o
	}
	return m
}

// ServeHTTP implements http.Handler.
func (s *Simulator) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Registry is the simulator's own Prometheus registry (served at /metrics).
func (s *Simulator) Registry() *prometheus.Registry { return s.registry }

// Close releases every request that is hanging (timeout fault), queued
// (X-DashScope-Wait-Timeout) or sleeping out its latency, so an
// http.Server's Shutdown can finish. It is idempotent.
func (s *Simulator) Close() { s.closeOnce.Do(func() { close(s.closed) }) }

// SetModel adds a model or replaces its limits and behaviour while running;
// its admission history and counters are kept, so a lowered limit applies to
// the traffic already in its window.
func (s *Simulator) SetModel(name string, m ModelConfig) error {
	if name == "" {
		return errors.New("set model: empty name")
	}
	if err := m.WithDefaults().validate("models." + name); err != nil {
		return fmt.Errorf("set model: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if md, ok := s.models[name]; ok {
		md.setConfig(s.resolve(m))
	} else {
		s.models[name] = s.newModel(name, m)
	}
	s.logger.Info("model limits changed", "model", name, "rpm", m.RPM, "tpm", m.TPM, "rps", m.RPS, "tps", m.TPS)
	return nil
}

// Model returns a model's configuration in force (defaults resolved).
func (s *Simulator) Model(name string) (ModelConfig, bool) {
	md := s.model(name)
	if md == nil {
		return ModelConfig{}, false
	}
	return md.config(), true
}

func (s *Simulator) model(name string) *model {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.models[name]
}

// authorized checks the bearer key in constant time; without configured keys
// everything is authorized.
func (s *Simulator) authorized(r *http.Request) bool {
	if len(s.cfg.APIKeys) == 0 {
		return true
	}
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	match := 0
	for _, k := range s.cfg.APIKeys {
		match |= subtle.ConstantTimeCompare([]byte(key), []byte(k))
	}
	return match == 1
}

func writeUnauthorized(w http.ResponseWriter) {
	writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key",
		"Incorrect API key provided. Send Authorization: Bearer <key> with a configured key.")
}

func (s *Simulator) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			writeUnauthorized(w)
			return
		}
		h(w, r)
	}
}

// waitTimeout reads X-DashScope-Wait-Timeout (seconds, may be fractional).
func waitTimeout(r *http.Request) time.Duration {
	v := r.Header.Get("X-DashScope-Wait-Timeout")
	if v == "" {
		return 0
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || f <= 0 || f > 1e6 {
		return 0
	}
	return time.Duration(f * float64(time.Second))
}

// readBody authorizes the request and reads its body; it has answered
// the request when ok is false.
func (s *Simulator) readBody(w http.ResponseWriter, r *http.Request) (body []byte, ok bool) {
	if !s.authorized(r) {
		writeUnauthorized(w)
		return nil, false
	}
	buf := bytes.NewBuffer(make([]byte, 0, min(max(r.ContentLength, 0), maxBody)+bytes.MinRead))
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBody)); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error", "read request body: "+err.Error())
		return nil, false
	}
	return buf.Bytes(), true
}

// modelOfKind finds the model a request names and checks that it serves
// the request's kind (a chat model has no embeddings, and the reverse);
// it has answered the request when it returns nil.
func (s *Simulator) modelOfKind(w http.ResponseWriter, name, kind string) *model {
	md := s.model(name)
	if md == nil {
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found",
			fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", name))
		return nil
	}
	if k := md.config().Kind; k != kind {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "model_not_supported",
			fmt.Sprintf("The model `%s` is a %s model and does not support %s requests.", name, k, kind))
		return nil
	}
	return md
}

func (s *Simulator) handleChat(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	p, err := parseRequest(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error", err.Error())
		return
	}
	md := s.modelOfKind(w, p.Model, KindChat)
	if md == nil {
		return
	}
	id := fmt.Sprintf("chatcmpl-sim%012x", s.ids.Add(1))
	w.Header().Set("x-request-id", id)

	cfg := md.config()
	out, capped := p.outputTokens(*cfg.Output)
	f := s.faults.draw()
	charged := out
	if f != faultNone {
		charged = 0 // a failed request produced no output
	}
	a := md.admit(r.Context(), s, p.inputTokens, charged, f, waitTimeout(r))
	if s.writeUnadmitted(w, a, p.Model, id) {
		return
	}
	defer md.done()
	if s.writeFault(r.Context(), w, f) {
		return
	}

	ttft, tpt := cfg.Latency.timing(a.inflight)
	resp := reply{id: id, model: p.Model, created: s.clock.Now().Unix(), content: p.content(),
		in: p.inputTokens, out: out, capped: capped}
	if p.Stream {
		s.stream(r.Context(), w, resp, p.StreamOptions != nil && p.StreamOptions.IncludeUsage, ttft, tpt)
		return
	}
	if !s.sleep(r.Context(), ttft+time.Duration(out)*tpt) {
		writeClosing(w)
		return
	}
	writeJSON(w, http.StatusOK, resp.completion())
}

// writeUnadmitted sets the rate-limit headers and answers a request that
// was not admitted (too large, cut by Close, rate limited); it reports
// whether it answered.
func (s *Simulator) writeUnadmitted(w http.ResponseWriter, a admission, model, id string) bool {
	setRateHeaders(w.Header(), a.headers)
	switch {
	case a.tooLarge != nil:
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error", a.tooLarge.Error())
	case a.cancelled:
		writeClosing(w)
	case a.refused.reason != "":
		s.writeRateLimited(w, model, id, a.refused)
	default:
		return false
	}
	return true
}

// writeFault answers an admitted request with its injected fault, if it
// drew one, and reports whether it did.
func (s *Simulator) writeFault(ctx context.Context, w http.ResponseWriter, f fault) bool {
	switch f {
	case fault500:
		writeError(w, http.StatusInternalServerError, "server_error", "internal_error", "The server had an error while processing your request (injected).")
	case fault503:
		writeError(w, http.StatusServiceUnavailable, "server_error", "service_unavailable", "The service is temporarily overloaded (injected).")
	case faultTimeout:
		s.hang(ctx, w)
	case faultReset:
		resetConnection(w)
	default:
		return false
	}
	return true
}

// hang answers nothing until the client gives up, the simulator closes or
// the configured fault timeout passes (then 504).
func (s *Simulator) hang(ctx context.Context, w http.ResponseWriter) {
	d := s.cfg.Faults.Timeout.D()
	if d <= 0 {
		select {
		case <-ctx.Done():
		case <-s.closed:
			writeClosing(w)
		}
		return
	}
	if s.sleep(ctx, d) {
		writeError(w, http.StatusGatewayTimeout, "server_error", "timeout", "The request timed out (injected).")
		return
	}
	writeClosing(w)
}

// writeClosing answers a request cut short by Close (a client that left
// reads nothing, so writing is harmless then).
func writeClosing(w http.ResponseWriter) {
	writeError(w, http.StatusServiceUnavailable, "server_error", "service_unavailable", "The simulator is shutting down.")
}

// resetConnection drops the client's connection without a response.
func resetConnection(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler) // net/http closes the connection without logging
}

func setRateHeaders(h http.Header, r rateHeaders) {
	if r.reqSet {
		h.Set("x-ratelimit-limit-requests", strconv.FormatInt(r.limReq, 10))
		h.Set("x-ratelimit-remaining-requests", strconv.FormatInt(r.remReq, 10))
		h.Set("x-ratelimit-reset-requests", r.resetReq.Round(time.Millisecond).String())
	}
	if r.tokSet {
		h.Set("x-ratelimit-limit-tokens", strconv.FormatInt(r.limTok, 10))
		h.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(r.remTok, 10))
		h.Set("x-ratelimit-reset-tokens", r.resetTok.Round(time.Millisecond).String())
	}
}
