package results

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
)

// Failpoints of the relay: TEST-ONLY, like the worker's (see
// worker.ParseFailpoint); the fault suite kills a consumer at them.
const (
	// FailpointRelayBeforePublish is passed when the relay has taken a
	// batch of events from the outbox and before it publishes them: the
	// jobs' results are committed and no event has left.
	FailpointRelayBeforePublish = "relay_before_publish"
	// FailpointRelayAfterPublish is passed when a batch is published and
	// before the outbox rows are deleted: a restart publishes the same
	// events again, with the same event ids.
	FailpointRelayAfterPublish = "relay_after_publish"
)

// RelayStore is the outbox the relay drains (internal/store).
type RelayStore interface {
	RelayResults(ctx context.Context, max int, wants func(store.ResultEvent) bool,
		publish func([]store.ResultEvent) ([]store.QueuedWebhook, error)) (int, error)
	PendingResults(ctx context.Context) (n int64, oldest time.Duration, err error)
	HasResultEvents(ctx context.Context) (bool, error)
	DropOrphanResults(ctx context.Context) (int64, error)
}

var _ RelayStore = (*store.Store)(nil)

// RelayParams configure a Relay.
type RelayParams struct {
	Store     RelayStore
	Publisher broker.ResultPublisher
	// WebhookURLs returns the operator's webhook endpoint of a tenant, or
	// "" (config tenants.<t>.webhook_url).
	WebhookURLs func(tenant string) string
	// Batch is the most events one round takes (default 500).
	Batch int
	// Parallel is how many rounds drain a backlog at once (default 2): one
	// reads and deletes in Postgres while another waits for the broker's
	// confirms.
	Parallel int
	// Idle is how long the relay waits when the outbox is empty, unless
	// Wake fires first (default 50ms): the most a job finished outside
	// this process (an API cancel, another replica's intake) waits for
	// its event and its long-polls. Each wait ends in one empty query.
	Idle time.Duration
	// PublishTimeout bounds a round's publish (default 15s).
	PublishTimeout time.Duration
	// Wake, when not nil, cuts an idle wait short (a job finished).
	Wake <-chan struct{}
	// Delivered, when not nil, is called after a round stored webhook
	// deliveries (wakes the webhook dispatcher).
	Delivered func()
	Log       *slog.Logger
	Metrics   *Metrics
	Failpoint func(name string)
	// Tracer traces each event's publish (trace.go); nil is tracing off.
	Tracer *telemetry.Tracer
}

// Relay publishes the result events of the outbox: every terminal
// transition, at least once, after it is durable. Every consumer replica
// runs one; they share the outbox without coordination.
type Relay struct {
	p RelayParams
}

// NewRelay returns a relay; Run starts it.
func NewRelay(p RelayParams) *Relay {
	if p.Batch <= 0 {
		p.Batch = 500
	}
	if p.Parallel <= 0 {
		p.Parallel = 2
	}
	if p.Idle <= 0 {
		p.Idle = 50 * time.Millisecond
	}
	if p.PublishTimeout <= 0 {
		p.PublishTimeout = 15 * time.Second
	}
	if p.Log == nil {
		p.Log = slog.New(slog.DiscardHandler)
	}
	if p.WebhookURLs == nil {
		p.WebhookURLs = func(string) string { return "" }
	}
	if p.Metrics == nil {
		p.Metrics = NewMetrics(nil)
	}
	return &Relay{p: p}
}

// keepEvery is how often the relay looks after the outbox as a whole
// (keepOutbox).
const keepEvery = 5 * time.Second

// Run relays until ctx ends. One loop watches the outbox (a cheap probe
// every Idle, or at once on Wake); when a round finds a full batch,
// Parallel rounds drain it. A failed round (broker or Postgres down) is
// retried with backoff; nothing is lost, since the events stay in the
// outbox until they are published.
func (r *Relay) Run(ctx context.Context) {
	backoff := time.Duration(0)
	keptAt := time.Time{}
	for ctx.Err() == nil {
		if time.Since(keptAt) >= keepEvery {
			r.keepOutbox(ctx)
			keptAt = time.Now()
		}
		n, err := r.probeAndRound(ctx)
		if err == nil && n == r.p.Batch {
			_, err = r.Drain(ctx)
		}
		switch {
		case err != nil && ctx.Err() == nil:
			r.p.Metrics.errors.Inc()
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			r.p.Log.Warn("relay result events", "error", err, "retry_in", backoff)
			if !sleep(ctx, backoff, nil) {
				return
			}
		case n > 0:
			backoff = 0 // jobs are finishing: look again at once
		default:
			backoff = 0
			if !sleep(ctx, r.p.Idle, r.p.Wake) {
				return
			}
		}
	}
}

// probeAndRound runs a round when the outbox holds anything: an idle relay
// costs Postgres one index probe per Idle, not a transaction.
func (r *Relay) probeAndRound(ctx context.Context) (int, error) {
	any, err := r.p.Store.HasResultEvents(ctx)
	if err != nil || !any {
		return 0, err
	}
	return r.Round(ctx)
}

// Drain relays until the outbox is empty, Parallel rounds at a time, and
// returns how many events it relayed (tests, benchmarks, tooling).
func (r *Relay) Drain(ctx context.Context) (int, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
		first error
	)
	for range r.p.Parallel {
		wg.Go(func() {
			for {
				n, err := r.Round(ctx)
				mu.Lock()
				total += n
				if err != nil && first == nil {
					first = err
				}
				mu.Unlock()
				if err != nil || n == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	return total, first
}

// keepOutbox drops the events of jobs that no longer exist and measures
// how far behind the outbox is.
func (r *Relay) keepOutbox(ctx context.Context) {
	if dropped, err := r.p.Store.DropOrphanResults(ctx); err == nil && dropped > 0 {
		r.p.Log.Warn("dropped result events of jobs that no longer exist", "events", dropped)
	}
	n, oldest, err := r.p.Store.PendingResults(ctx)
	if err != nil {
		return
	}
	r.p.Metrics.pending.Set(float64(n))
	r.p.Metrics.oldest.Set(oldest.Seconds())
}

// sleep waits d, or until wake fires; false when ctx ended.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-wake:
	}
	return true
}

// Round relays one batch of events and returns how many it relayed.
func (r *Relay) Round(ctx context.Context) (int, error) {
	var deliveries int
	n, err := r.p.Store.RelayResults(ctx, r.p.Batch, r.heard, func(events []store.ResultEvent) ([]store.QueuedWebhook, error) {
		r.failpoint(FailpointRelayBeforePublish)
		msgs, hooks, err := r.messages(events)
		if err != nil {
			return nil, err
		}
		spans := r.traceEvents(ctx, events)
		// The round's transaction stays open while the broker confirms,
		// holding its rows and the job feed's horizon: a broker slower
		// than this fails the round, which is tried again.
		pctx, cancel := context.WithTimeout(ctx, r.p.PublishTimeout)
		unroutable, err := r.p.Publisher.PublishResults(pctx, msgs)
		cancel()
		endEvents(spans, err)
		var refused *broker.ResultsRefused
		if errors.As(err, &refused) {
			p := r.putOff(events, hooks, refused)
			deliveries = len(p.Webhooks)
			if len(p.Events) == 0 && len(p.Again) == 0 {
				return p.Webhooks, nil // every refused copy given up
			}
			return nil, p
		}
		if err != nil {
			return nil, err
		}
		for _, i := range unroutable {
			r.p.Metrics.unroutable.Inc()
			r.p.Log.Warn("reply queue does not exist; the job's reply is dropped (its result is in Postgres and on llmq.results)",
				"tenant", msgs[i].Tenant, "job_id", msgs[i].JobID, "reply_to", msgs[i].ReplyTo)
		}
		r.failpoint(FailpointRelayAfterPublish)
		deliveries = len(hooks)
		return hooks, nil
	})
	if err != nil {
		return 0, err
	}
	r.p.Metrics.published.Add(float64(n))
	r.p.Metrics.webhooks.Add(float64(deliveries))
	if deliveries > 0 && r.p.Delivered != nil {
		r.p.Delivered()
	}
	return n, nil
}

// heard reports whether anything receives e: the results exchange or topic
// (unless the publisher knows its routing key is unheard now), or one of
// the job's own destinations. Only those events are read in full and
// encoded.
func (r *Relay) heard(e store.ResultEvent) bool {
	j := e.Job
	if j.ReplyTo != "" || j.ResultTopic != "" || j.CallbackURL != "" || r.p.WebhookURLs(j.Tenant) != "" {
		return true
	}
	a, ok := r.p.Publisher.(broker.ResultAudience)
	return !ok || !a.Unheard(RoutingKey(j.Tenant, j.Status))
}

// maxPutOffs is how often an event the broker refuses on its own is put
// off (1 s doubling to a minute: ~3 min in all) before its broker copies
// are given up: a refusal that lasts (an event too large for Kafka, a reply
// queue nobody drains) would otherwise keep its job from retention and the
// outbox's age alert up for good. Its result stays in Postgres, its
// webhooks go out, and its long-polls have been told.
const maxPutOffs = 8

// putOff is the round's answer when the broker refused some events on
// their own: those are tried again after a backoff (store.PutOff), the
// others are done, with their webhook deliveries. An event is refused as
// a whole, so its webhooks wait for it, up to maxPutOffs.
func (r *Relay) putOff(events []store.ResultEvent, hooks []store.QueuedWebhook, refused *broker.ResultsRefused) *store.PutOff {
	p := &store.PutOff{}
	later := map[string]bool{}
	for i, err := range refused.Refused {
		e := events[i]
		if errors.Is(err, broker.ErrOutOfTime) {
			// Not refused: the publish ran out of time (a batch the broker
			// refused for its size, split and written piece by piece).
			p.Again = append(p.Again, i)
			later[e.EventID] = true
			r.p.Log.Warn("result event not published in the round's time; tried again", "tenant", e.Job.Tenant,
				"job_id", e.Job.ID)
			continue
		}
		if e.PutOff+1 >= maxPutOffs {
			r.p.Metrics.givenUp.Inc()
			r.p.Log.Error("result event refused by the broker too often; its broker copies are given up (the result is in Postgres, webhooks go out)",
				"tenant", e.Job.Tenant, "job_id", e.Job.ID, "refusals", e.PutOff+1, "error", err)
			continue
		}
		p.Events = append(p.Events, i)
		later[e.EventID] = true
		r.p.Metrics.putOff.Inc()
		r.p.Log.Warn("result event refused by the broker; tried again later", "tenant", e.Job.Tenant,
			"job_id", e.Job.ID, "error", err)
	}
	for _, h := range hooks {
		if !later[h.EventID] {
			p.Webhooks = append(p.Webhooks, h)
		}
	}
	return p
}

func (r *Relay) failpoint(name string) {
	if r.p.Failpoint != nil {
		r.p.Failpoint(name)
	}
}

// messages builds each event's broker message and webhook deliveries.
func (r *Relay) messages(events []store.ResultEvent) ([]broker.ResultMessage, []store.QueuedWebhook, error) {
	msgs := make([]broker.ResultMessage, len(events))
	var hooks []store.QueuedWebhook
	for i, e := range events {
		body, err := EncodeEvent(e)
		if err != nil {
			return nil, nil, err
		}
		j := e.Job
		msgs[i] = broker.ResultMessage{
			EventID: e.EventID, Type: EventType(j.Status), Tenant: j.Tenant, JobID: j.ID,
			RoutingKey: RoutingKey(j.Tenant, j.Status), Body: body,
			ReplyTo: j.ReplyTo, CorrelationID: j.CorrelationID, Topic: j.ResultTopic,
		}
		if len(j.Response) > 0 {
			msgs[i].Slim = func() ([]byte, error) { return SlimEvent(e) }
			msgs[i].SlimPublished = func() { r.slimPublished(e) }
		}
		for _, url := range webhookURLs(j.CallbackURL, r.p.WebhookURLs(j.Tenant)) {
			hooks = append(hooks, store.QueuedWebhook{EventID: e.EventID, Tenant: j.Tenant, JobID: j.ID, URL: url, Payload: body,
				TraceParent: j.TraceParent, TraceState: j.TraceState})
		}
	}
	return msgs, hooks, nil
}

// slimPublished counts an event the broker took only without its response.
func (r *Relay) slimPublished(e store.ResultEvent) {
	r.p.Metrics.slimmed.Inc()
	r.p.Log.Warn("result event too large for the broker; published without its response (GET /v1/jobs/{id} has it)",
		"tenant", e.Job.Tenant, "job_id", e.Job.ID, "response_bytes", len(e.Job.Response))
}

// webhookURLs are the endpoints of an event: the job's callback and the
// tenant's endpoint, each when set, once when they are the same.
func webhookURLs(job, tenant string) []string {
	var urls []string
	if job != "" {
		urls = append(urls, job)
	}
	if tenant != "" && tenant != job {
		urls = append(urls, tenant)
	}
	return urls
}

// EncodeEvent is the JSON of the result event of an outbox row.
func EncodeEvent(e store.ResultEvent) ([]byte, error) {
	return encodeEvent(e, DocumentOf(e.Job))
}

// SlimEvent is EncodeEvent without the job's response (ResponseOmitted):
// what a broker gets that refuses the whole event for its size, an answer
// of megabytes against Kafka's 1 MB default. The event keeps its id, so a
// reader that dedupes sees one event either way.
func SlimEvent(e store.ResultEvent) ([]byte, error) {
	d := DocumentOf(e.Job)
	if d.Response != nil {
		d.Response, d.ResponseOmitted = nil, true
	}
	return encodeEvent(e, d)
}

func encodeEvent(e store.ResultEvent, d Document) ([]byte, error) {
	ev := Event{
		Type: EventType(e.Job.Status), Version: EventVersion, EventID: e.EventID,
		Timestamp: e.OccurredAt, Data: d,
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode result event of job %s: %w", e.Job.ID, err)
	}
	return body, nil
}
