// Package finished hears Postgres announce finished jobs (channel
// llmq_job_finished, sent by the result relay: internal/results) on one dedicated
// connection per process and wakes whatever waits for them: the long-polls
// of GET /v1/jobs/{id}?wait= (docs/design.md#results). It also counts the
// finishes per lane, the drain rate a queued job's expected start is
// computed from, and per tenant, the drain rate a tenant's back-pressure
// (its Retry-After and expected drain time) is computed from.
package finished

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/pglisten"
	"github.com/llmq/llmq/internal/store"
)

// Channel is the notification channel the result relay writes to when it
// has published finished jobs' events (store.FinishedChannel); a payload
// holds a line "<priority> <tenant> <id>" per job.
const Channel = store.FinishedChannel

// Config builds a Listener. Connect is required.
type Config struct {
	// Connect opens the listening connection: a connection of its own, not
	// one of a pool, since it stays in LISTEN for the process's life.
	Connect func(ctx context.Context) (*pgx.Conn, error)
	Logger  *slog.Logger
	// Now is the clock of the drain rate (default time.Now).
	Now func() time.Time
	// MinBackoff and MaxBackoff bound the wait between reconnects
	// (defaults 100ms and 10s).
	MinBackoff, MaxBackoff time.Duration
}

// Listener fans the notifications of one connection out to waiters
// registered by job key. Registering and stopping a waiter are O(1) and
// start no goroutine; a notification costs one map lookup. Safe for
// concurrent use.
type Listener struct {
	cfg Config

	mu      sync.Mutex
	waiters map[job.Key]map[*Waiter]struct{}
	count   int
	// connected is closed and replaced as the connection comes and goes:
	// tests and tools wait on it.
	connected bool
	up        chan struct{}
	rates     map[job.Priority]*rate
	tenants   *tenantRates
	started   time.Time
}

// New returns a Listener; Run makes it listen.
func New(cfg Config) (*Listener, error) {
	if cfg.Connect == nil {
		return nil, errors.New("finished: Connect is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 10 * time.Second
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	l := &Listener{
		cfg:     cfg,
		waiters: map[job.Key]map[*Waiter]struct{}{},
		up:      make(chan struct{}),
		rates:   make(map[job.Priority]*rate, len(job.Priorities)),
		tenants: newTenantRates(),
		started: cfg.Now(),
	}
	for _, p := range job.Priorities {
		l.rates[p] = &rate{}
	}
	return l, nil
}

// Waiter is one registration for a job's finish. C receives a value when
// the job's row may have changed: its finish was announced, or the
// listening connection was (re)established and announcements may have
// been missed. Either way the waiter re-reads the row.
type Waiter struct {
	// C is buffered: wakes that arrive before the last was received merge.
	C   <-chan struct{}
	c   chan struct{}
	key job.Key
	l   *Listener
}

// Register starts waiting for key's finish. Register before reading the
// row, so that a finish committed between the read and the wait still
// wakes the waiter. Call Stop when done.
func (l *Listener) Register(key job.Key) *Waiter {
	c := make(chan struct{}, 1)
	w := &Waiter{C: c, c: c, key: key, l: l}
	l.mu.Lock()
	set := l.waiters[key]
	if set == nil {
		set = make(map[*Waiter]struct{}, 1)
		l.waiters[key] = set
	}
	set[w] = struct{}{}
	l.count++
	l.mu.Unlock()
	return w
}

// Stop ends the registration; calling it again does nothing.
func (w *Waiter) Stop() {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	set := l.waiters[w.key]
	if _, ok := set[w]; !ok {
		return
	}
	delete(set, w)
	l.count--
	if len(set) == 0 {
		delete(l.waiters, w.key)
	}
}

func (w *Waiter) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// Waiting is the number of registered waiters.
func (l *Listener) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count
}

// Listening returns a channel closed once the listener is connected and
// listening (now, or as soon as it next is).
func (l *Listener) Listening() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.up
}

// Run listens until ctx ends, reconnecting with backoff whenever the
// connection fails. On every (re)connect it wakes every waiter, since a
// finish may have been announced while nobody listened.
func (l *Listener) Run(ctx context.Context) {
	pglisten.Loop{
		Connect: l.cfg.Connect, Channel: Channel, MinBackoff: l.cfg.MinBackoff, MaxBackoff: l.cfg.MaxBackoff,
		// Waiters registered before now may have missed a finish; those
		// that register once Listening() reports the connection up cannot,
		// and are not woken for nothing.
		OnUp:      func() { l.wakeAll(); l.setConnected(true) },
		OnPayload: l.notify,
		OnDown:    func() { l.setConnected(false) },
		OnRetry: func(err error, backoff time.Duration) {
			l.cfg.Logger.Warn("job-finished listener: connection lost, reconnecting", "error", err, "backoff", backoff)
		},
	}.Run(ctx)
}

func (l *Listener) setConnected(up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if up == l.connected {
		return
	}
	l.connected = up
	if up {
		close(l.up)
	} else {
		l.up = make(chan struct{})
	}
}

func (l *Listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, set := range l.waiters {
		for w := range set {
			w.wake()
		}
	}
}

// notify handles one payload: lines "<priority> <tenant> <id>".
func (l *Listener) notify(payload string) {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for line := range strings.SplitSeq(payload, "\n") {
		lane, rest, ok1 := strings.Cut(line, " ")
		tenant, id, ok2 := strings.Cut(rest, " ")
		if !ok1 || !ok2 {
			l.cfg.Logger.Warn("job-finished listener: malformed payload line", "line", line)
			continue
		}
		if r := l.rates[job.Priority(lane)]; r != nil {
			r.add(now)
		}
		l.tenants.add(tenant, now)
		for w := range l.waiters[job.Key{Tenant: tenant, ID: id}] {
			w.wake()
		}
	}
}

// DrainRate is the jobs of lane p finished per second over the last
// minute (or since the listener started, when that is shorter), as the
// notifications this listener heard count them.
func (l *Listener) DrainRate(p job.Priority) float64 {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rates[p]
	if r == nil {
		return 0
	}
	return float64(r.sum(now)) / l.window(now).Seconds()
}

// window is the span the rates divide by: the last minute, or the time
// since the listener started when that is shorter (at least a second).
// Callers hold l.mu.
func (l *Listener) window(now time.Time) time.Duration {
	return min(rateWindow, max(now.Sub(l.started), time.Second))
}

// TenantDrainRate is tenant's jobs (every lane) finished per second over
// the last minute, as DrainRate counts them.
func (l *Listener) TenantDrainRate(tenant string) float64 {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return float64(l.tenants.sum(tenant, now)) / l.window(now).Seconds()
}

// TenantDrainRates is every tenant's drain rate (TenantDrainRate), for the
// tenants that finished a job in the last minute.
func (l *Listener) TenantDrainRates() map[string]float64 {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.window(now).Seconds()
	sums := l.tenants.sums(now)
	out := make(map[string]float64, len(sums))
	for name, n := range sums {
		out[name] = float64(n) / w
	}
	return out
}
