// Package ingest is llmq's intake. Producers publish job messages to the
// public entry (RabbitMQ exchange llmq.jobs, Kafka topics llmq.jobs.<lane>);
// the Ingester reads them, records each job in Postgres in batches (one
// INSERT per batch) and forwards it to the internal lane the rate-controlled
// workers consume, and acks the intake message only after both, so every
// job published has a row within moments whatever the backlog behind it:
// `queued`, or `failed` with the reason for a message it refuses.
//
// Verdicts, per message:
//   - a valid job whose (tenant, id) is new: stored queued, forwarded;
//   - the same job again (equal as JSON values, field by field): nothing is
//     stored; a job still queued is forwarded again (the first forward may
//     have been lost with a crash), any other is left alone;
//   - another job under a stored id, or a malformed body reusing it: a dead
//     letter "conflicts with the stored job", the stored job untouched;
//   - published under a broker identity (RabbitMQ user_id of a tenant's
//     broker_users, a tenant's own Kafka topic) while the body names
//     another tenant, or naming a tenant that has broker_users without its
//     identity: only a dead letter with the rule as reason, filed under the
//     publisher's tenant; nothing is stored under the claimed one;
//   - malformed, for a model that models: does not list, or naming a
//     callback_url or result_topic its tenant may not use (results.Policy):
//     a failed row under its id with the reason, and the body as its dead
//     letter (only the dead letter when the id cannot be read).
//
// The ingester is not rate-controlled: it runs inside `consumer run` beside
// the workers. A Postgres or broker outage holds the batch and retries it
// with backoff; the intake's prefetch bounds what is held, so the backlog
// stays on the intake, where the broker's own limits apply. On shutdown the
// messages not yet recorded are handed back; a recorded job whose forward
// did not go through is marked as having no message, and the reconciler
// publishes it.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/batch"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
)

// Store is what the ingester needs from internal/store.
type Store interface {
	InsertClaiming(ctx context.Context, jobs []job.Job, cl store.Claiming) ([]store.BatchInsert, error)
	UnstorableJobs(ctx context.Context, jobs []job.Job) ([]error, error)
	RecordIntakeFailure(ctx context.Context, f store.IntakeFailure) (store.IntakeOutcome, error)
	RecordDeadLetter(ctx context.Context, dl store.DeadLetterRow) (int64, error)
	MarkUnenqueued(ctx context.Context, key job.Key) error
	Absent(ctx context.Context, jobs []job.Job) ([]bool, error)
}

var _ Store = (*store.Store)(nil)

// Config tunes an Ingester.
type Config struct {
	// Prefetch is the intake prefetch per lane (default 1000).
	Prefetch int
	// Batch is the most messages recorded in one statement (default 500).
	Batch int
	// BatchWait is how long a batch waits for more messages (default 2ms).
	BatchWait time.Duration
	// Flushers is how many batches are recorded at once (default 4).
	Flushers int
	// Limits bound a job message (payload size, max_tokens).
	Limits job.Limits
	// CheckModels, when set, judges a job's models (config.CheckJobModels):
	// a job naming a model that is not configured, or that does not serve
	// its kind, is refused with the reason.
	CheckModels func(j *job.Job) error
	// CheckDestination judges a job's callback_url and result_topic
	// against the tenants' configuration (results.Policy.Check); a job it
	// refuses is recorded failed with the reason. Default: the policy of
	// no tenants, which refuses every callback_url and result_topic.
	CheckDestination func(j job.Job) error
	// BrokerUsers maps broker users to their tenants
	// (config.Config.BrokerUserTenants): a message whose RabbitMQ user_id
	// is one of them belongs to that tenant, and a tenant that has any
	// takes messages only from them or its own Kafka topics (broker.Identity).
	BrokerUsers map[string]string
	// RetryMin and RetryMax bound the backoff of a batch held by an outage
	// (defaults 100ms and 5s).
	RetryMin, RetryMax time.Duration
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.Prefetch <= 0 {
		c.Prefetch = 1000
	}
	if c.Batch <= 0 {
		c.Batch = 500
	}
	if c.BatchWait <= 0 {
		c.BatchWait = 2 * time.Millisecond
	}
	if c.Flushers <= 0 {
		c.Flushers = 4
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 5 * time.Second
	}
	if c.CheckDestination == nil {
		c.CheckDestination = results.NewPolicy(config.Config{}).Check
	}
	c.Limits = c.Limits.WithDefaults()
	return c
}

// Deps are the ingester's collaborators.
type Deps struct {
	Store Store
	// Intake is a subscriber of the public entry (e.g.
	// rabbitmq.NewIntakeSubscriber).
	Intake broker.Subscriber
	// Lanes publishes to the internal lanes (broker.Publisher.Publish).
	Lanes  broker.Publisher
	Logger *slog.Logger
	// Registerer receives the ingester's metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Runner, when set, runs jobs this process has room for without a lane
	// (the direct intake, docs/design.md#direct-intake): the worker of the
	// same process.
	Runner Runner
	// Tracer traces each intake message (trace.go); nil is tracing off.
	Tracer *telemetry.Tracer
}

// Runner is the worker of the same process as the ingester seen from the
// direct intake (worker.Worker): Reserve takes room for a job, and each
// reservation ends in Adopt (the job was stored claimed under Claiming's
// owner and lease) or Unreserve. A job Reserve has no room for is stored
// parked when Overflows says so (its group holds all this process takes
// of it), else published on its lane; Parked tells the runner of each job
// the intake stored parked.
type Runner interface {
	Reserve(j job.Job) bool
	Unreserve(j job.Job)
	Adopt(rec store.Record)
	Claiming() (owner string, lease time.Duration)
	Overflows(j job.Job) bool
	Parked(j job.Job)
	// WritesOnce reports whether j, which Reserve took room for, may run
	// before its row is written (internal/worker/writeonce.go).
	WritesOnce(j job.Job) bool
	// AdoptUnwritten runs rec, not stored yet, in the room Reserve took;
	// the runner acks intake once the row is written, or hands it back.
	AdoptUnwritten(rec store.Record, readAt time.Time, intake broker.Delivery)
	// WriteFirst writes the row of a job of j's key that runs unwritten,
	// before j is stored and judged against it.
	WriteFirst(j job.Job)
}

// Ingester moves jobs from the intake into Postgres and the lanes. Create
// with New, run with Run.
type Ingester struct {
	cfg      Config
	store    Store
	intake   broker.Subscriber
	lanes    broker.Publisher
	runner   Runner
	log      *slog.Logger
	metrics  *metrics
	identity broker.Identity
	tracer   *telemetry.Tracer

	// stop ends retries when shutdown starts; bg settles deliveries after.
	stop context.Context
	bg   context.Context
	// handedOn counts the intake messages handed on with their jobs
	// (handOn) and not settled by the runner yet.
	handedOn sync.WaitGroup
	// keys: the job keys a batch is deciding on (keylock.go).
	keys *keyLocks
}

// New builds an ingester.
func New(cfg Config, deps Deps) (*Ingester, error) {
	if deps.Store == nil || deps.Intake == nil || deps.Lanes == nil {
		return nil, errors.New("ingest: Store, Intake and Lanes are required")
	}
	in := &Ingester{cfg: cfg.WithDefaults(), store: deps.Store, intake: deps.Intake, lanes: deps.Lanes, runner: deps.Runner, log: deps.Logger,
		identity: broker.NewIdentity(cfg.BrokerUsers), tracer: deps.Tracer, keys: newKeyLocks()}
	if in.log == nil {
		in.log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	in.metrics = m
	return in, nil
}

// message is one intake delivery on its way through a batch.
type message struct {
	d    broker.Delivery
	lane job.Priority
}

// Run ingests until ctx ends, then stops reading, finishes the batches in
// hand (handing back what it could not record) and returns nil.
func (in *Ingester) Run(ctx context.Context) error {
	in.stop, in.bg = ctx, context.WithoutCancel(ctx)
	// The subscriptions outlive ctx until every delivery is settled.
	subCtx, subCancel := context.WithCancel(in.bg)
	defer subCancel()
	var chans []<-chan broker.Delivery
	for _, lane := range job.Priorities {
		ch, err := in.intake.Subscribe(subCtx, lane, in.cfg.Prefetch)
		if err != nil {
			return fmt.Errorf("ingest: subscribe to intake %s: %w", lane, err)
		}
		chans = append(chans, ch)
	}
	b := batch.New(in.cfg.Batch, in.cfg.BatchWait, in.cfg.Flushers, in.flush)
	var readers sync.WaitGroup
	for i, ch := range chans {
		lane := job.Priorities[i]
		readers.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case d, ok := <-ch:
					if !ok {
						return
					}
					b.Add(message{d: d, lane: lane})
				}
			}
		})
	}
	in.log.Info("ingester started", "prefetch", in.cfg.Prefetch, "batch", in.cfg.Batch)
	<-ctx.Done()
	readers.Wait()
	b.Close()
	// The runner settles what it was handed on when those jobs end, at the
	// latest when it stops; the subscription must be open for that.
	in.handedOn.Wait()
	in.log.Info("ingester stopped")
	return nil
}

// finalError is an error persist does not retry.
type finalError struct{ err error }

func (e finalError) Error() string { return e.err.Error() }

// persist runs fn until it succeeds, backing off between tries, or until
// shutdown starts (then it returns the last error). An error fn wraps in
// finalError is returned at once, unwrapped: trying again would not help.
func (in *Ingester) persist(what string, fn func(ctx context.Context) error) error {
	wait := in.cfg.RetryMin
	for {
		err := fn(in.bg)
		var final finalError
		if errors.As(err, &final) {
			return final.err
		}
		if err == nil {
			return nil
		}
		in.metrics.retries.WithLabelValues(what).Inc()
		in.log.Warn("ingest: will retry", "op", what, "in", wait.String(), "error", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-in.stop.Done():
			t.Stop()
			return err
		}
		wait = min(2*wait, in.cfg.RetryMax)
	}
}
