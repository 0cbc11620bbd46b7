package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
)

// Store is what the Dispatcher needs from internal/store.
type Store interface {
	ClaimWebhookDeliveries(ctx context.Context, now time.Time, lease time.Duration, limit int) ([]store.WebhookDelivery, error)
	MarkWebhookDelivered(ctx context.Context, d store.WebhookDelivery, status int, at time.Time) error
	MarkWebhookRetry(ctx context.Context, d store.WebhookDelivery, a store.WebhookAttempt, next time.Time) error
	MarkWebhookDead(ctx context.Context, d store.WebhookDelivery, a store.WebhookAttempt) error
	PendingWebhooks(ctx context.Context) (int64, error)
}

var _ Store = (*store.Store)(nil)

// Params builds a Dispatcher. Store is required.
type Params struct {
	Store Store
	// Tenants hold the webhook secrets, by tenant.
	Tenants map[string]config.Tenant
	// Webhooks tunes delivery; zero fields take config's defaults.
	Webhooks config.Webhooks
	// Client sends the webhooks (default: NewClient from Webhooks). Tests
	// give one whose LookupIP points names at test servers.
	Client *http.Client
	// Now is the clock (default time.Now). Due times, leases, backoff,
	// the retry window and the signed timestamp all read it.
	Now func() time.Time
	// Poll is how often due deliveries are looked for when nothing wakes
	// the dispatcher sooner (default 500ms).
	Poll time.Duration
	// Rand draws the backoff jitter in [0, 1) (default math/rand/v2).
	Rand   func() float64
	Logger *slog.Logger
	// Registerer receives the dispatcher's metrics (nil: not registered).
	Registerer prometheus.Registerer
	// OnAttempt, when set, is called after each attempt is recorded.
	OnAttempt func(Attempt)
	// Tracer traces each attempt of a traced job's delivery; nil is
	// tracing off.
	Tracer *telemetry.Tracer
}

// Attempt is one recorded delivery attempt.
type Attempt struct {
	DeliveryID int64
	Tenant     string
	JobID      string
	// Outcome is OutcomeDelivered, OutcomeRetry or OutcomeDead.
	Outcome string
	// Number is the attempt's number, from 1.
	Number int
	// Status is the receiver's HTTP status, 0 if none came.
	Status int
	Error  string
}

// maxClaim bounds the deliveries claimed in one statement.
const maxClaim = 64

// leaseMargin is how long past the attempt timeout a claim holds a
// delivery: enough to record the outcome after the longest attempt.
const leaseMargin = 30 * time.Second

// Dispatcher sends the pending webhook deliveries. Create with New, run
// with Run; any number of dispatchers may share one database.
type Dispatcher struct {
	store     Store
	keys      map[string][]byte
	cfg       config.Webhooks
	client    *http.Client
	now       func() time.Time
	poll      time.Duration
	rand      func() float64
	log       *slog.Logger
	metrics   *metrics
	onAttempt func(Attempt)
	lease     time.Duration
	kick      chan struct{}
	tracer    *telemetry.Tracer
}

// New checks p and builds a dispatcher. The tenants' secrets are decoded
// here: a malformed one is an error (naming the tenant, not the secret).
func New(p Params) (*Dispatcher, error) {
	if p.Store == nil {
		return nil, errors.New("webhook: Store is required")
	}
	w := p.Webhooks
	if w.Timeout <= 0 {
		w.Timeout = 10 * time.Second
	}
	if w.RetryFor <= 0 {
		w.RetryFor = 25 * time.Hour
	}
	if w.MaxResponseBytes <= 0 {
		w.MaxResponseBytes = 64 << 10
	}
	if w.Concurrency <= 0 {
		w.Concurrency = 16
	}
	keys := make(map[string][]byte, len(p.Tenants))
	for name, t := range p.Tenants {
		if t.WebhookSecret == "" {
			continue
		}
		k, err := config.DecodeWebhookSecret(t.WebhookSecret)
		if err != nil {
			return nil, fmt.Errorf("webhook: tenants.%s.webhook_secret: %w", name, err)
		}
		keys[name] = k
	}
	d := &Dispatcher{
		store: p.Store, keys: keys, cfg: w, client: p.Client, now: p.Now, poll: p.Poll, rand: p.Rand,
		log: p.Logger, onAttempt: p.OnAttempt, lease: w.Timeout + leaseMargin, kick: make(chan struct{}, 1), tracer: p.Tracer,
	}
	if d.client == nil {
		d.client = NewClient(ClientConfig{AllowPrivate: w.AllowPrivate, Timeout: w.Timeout})
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.poll <= 0 {
		d.poll = 500 * time.Millisecond
	}
	if d.rand == nil {
		d.rand = rand.Float64
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(p.Registerer)
	if err != nil {
		return nil, err
	}
	d.metrics = m
	return d, nil
}

// Kick wakes the dispatcher to look for due deliveries now (the result
// relay calls it after writing some). It never blocks.
func (d *Dispatcher) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Run sends due deliveries until ctx ends, then waits for the attempts in
// flight (each bounded by webhooks.timeout) and returns nil. An attempt cut
// short by the end of ctx is not recorded: its lease runs out and it is
// tried again, by this process's successor or another replica.
func (d *Dispatcher) Run(ctx context.Context) error {
	defer d.client.CloseIdleConnections()
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, d.cfg.Concurrency)
	tick := time.NewTicker(d.poll)
	defer tick.Stop()
	var counted time.Time
	for {
		more := false
		if free := cap(slots) - len(slots); free > 0 {
			limit := min(free, maxClaim)
			batch, err := d.store.ClaimWebhookDeliveries(ctx, d.now(), d.lease, limit)
			switch {
			case ctx.Err() != nil:
				return nil
			case err != nil:
				d.log.Warn("claim webhook deliveries", "error", err)
			default:
				for _, del := range batch {
					// Never blocks: batch fits the free slots, and only
					// this loop fills them.
					slots <- struct{}{}
					d.metrics.inFlight.Inc()
					wg.Go(func() {
						defer func() {
							d.metrics.inFlight.Dec()
							<-slots
							d.Kick()
						}()
						d.deliver(ctx, del)
					})
				}
				more = len(batch) == limit
			}
		}
		if more {
			continue // more may be due
		}
		if now := d.now(); now.Sub(counted) >= 10*time.Second || now.Before(counted) {
			counted = now
			if n, err := d.store.PendingWebhooks(ctx); err == nil {
				d.metrics.pending.Set(float64(n))
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-d.kick:
		case <-tick.C:
		}
	}
}

// deliver makes one attempt of del and records it.
func (d *Dispatcher) deliver(ctx context.Context, del store.WebhookDelivery) {
	at := d.now()
	var res result
	if key, ok := d.keys[del.Tenant]; ok {
		start := time.Now()
		sctx, span := d.startTrace(ctx, del)
		res = d.send(sctx, del, key, at)
		endTrace(span, res)
		d.metrics.duration.Observe(time.Since(start).Seconds())
	} else {
		// Configuration can change after the job was accepted: never send
		// unsigned; the operator may add the secret within the window.
		res = result{err: "no webhook secret is configured for the tenant"}
	}
	if !res.ok() && ctx.Err() != nil {
		return // cut short by shutdown, not the receiver's doing
	}
	recCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	a := Attempt{DeliveryID: del.ID, Tenant: del.Tenant, JobID: del.JobID, Number: del.Attempts + 1, Status: res.status, Error: res.err}
	var err error
	if res.ok() {
		a.Outcome = OutcomeDelivered
		err = d.store.MarkWebhookDelivered(recCtx, del, res.status, d.now())
	} else {
		failure := store.WebhookAttempt{Status: res.status, Error: res.err}
		deadline := del.CreatedAt.Add(d.cfg.RetryFor)
		if next, retry := nextAttempt(a.Number, d.now(), deadline, d.rand()); retry {
			a.Outcome = OutcomeRetry
			err = d.store.MarkWebhookRetry(recCtx, del, failure, next)
		} else {
			a.Outcome = OutcomeDead
			err = d.store.MarkWebhookDead(recCtx, del, failure)
		}
	}
	logArgs := []any{"delivery_id", del.ID, "tenant", del.Tenant, "job_id", del.JobID, "host", hostOf(del.URL),
		"attempt", a.Number, "outcome", a.Outcome, "status", res.status, "error", res.err}
	if err != nil {
		// A lost lease means another dispatcher took the delivery over;
		// anything else leaves it to be tried again when the lease ends.
		d.log.Warn("record webhook attempt", append(logArgs, "record_error", err)...)
		return
	}
	d.metrics.attempts.WithLabelValues(a.Outcome).Inc()
	switch a.Outcome {
	case OutcomeDead:
		d.log.Warn("webhook delivery dead: retry window over", logArgs...)
	default:
		d.log.Debug("webhook attempt", logArgs...)
	}
	if d.onAttempt != nil {
		d.onAttempt(a)
	}
}
