package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os/exec"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
)

// The brokers a run can go through (Env.Broker).
const (
	BrokerMemory   = "memory"
	BrokerRabbitMQ = "rabbitmq"
	BrokerKafka    = "kafka"
)

// Brokers lists the Env.Broker values.
var Brokers = []string{BrokerMemory, BrokerRabbitMQ, BrokerKafka}

// runBroker is one run's broker and the clients of it a deployment would
// hold: the worker's lane subscriber, the ingester's intake subscriber and
// lane publisher, an outside producer's publisher (raw job messages onto
// the intake) and, on a real broker, the producer API's publisher and
// inspector. Each client has a connection of its own, as the processes of
// a deployment have.
type runBroker struct {
	name        string
	sub, intake broker.Subscriber
	lanes, raw  broker.Publisher
	// apiPub and apiInsp serve the producer API; nil on the memory broker,
	// whose runs keep publishing every job raw.
	apiPub  broker.Publisher
	apiInsp broker.Inspector
	closers []func()
}

// brokerDriver opens clients of one broker.
type brokerDriver struct {
	publisher  func(ctx context.Context) (broker.Publisher, error)
	subscriber func(ctx context.Context, intake bool) (broker.Subscriber, error)
	inspector  func(ctx context.Context) (broker.Inspector, error)
}

// openBroker gives a run a broker of its own: a new memory broker; a vhost
// created for the run on the RabbitMQ of env.AMQPURL (the contract's names,
// llmq.jobs and the rest, as a deployment has them); a kfake cluster
// started for the run, or, on the Kafka of env.KafkaBrokers, topics and
// groups under a prefix of the run's own. close undoes it all.
func openBroker(ctx context.Context, env Env, log *slog.Logger) (b *runBroker, err error) {
	b = &runBroker{name: env.broker()}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	switch b.name {
	case BrokerMemory:
		mb := memory.New(memory.Config{})
		b.onClose(func() { _ = mb.Close() })
		b.sub, b.intake = track(b, mb.Subscriber()), track(b, mb.IntakeSubscriber())
		b.lanes, b.raw = track(b, mb.Publisher()), track(b, mb.Publisher())
		return b, nil
	case BrokerRabbitMQ:
		vhost, drop, err := freshVhost(env.AMQPURL)
		if err != nil {
			return b, err
		}
		b.onClose(drop)
		return b, b.connect(ctx, rabbitDriver(rabbitmq.Config{URL: vhost, Logger: log}))
	case BrokerKafka:
		cfg := kafka.Config{Brokers: env.KafkaBrokers, Logger: log}
		if len(cfg.Brokers) == 0 {
			c, err := kfake.NewCluster(kfake.NumBrokers(1))
			if err != nil {
				return b, fmt.Errorf("start in-process kfake cluster: %w", err)
			}
			b.onClose(c.Close)
			cfg.Brokers = c.ListenAddrs()
		} else {
			cfg.Prefix = "bench-" + randomHex(6) + "."
			b.onClose(func() { _ = kafka.DeleteTopics(context.WithoutCancel(ctx), cfg) })
		}
		return b, b.connect(ctx, kafkaDriver(cfg))
	}
	return b, fmt.Errorf("unknown broker %q", b.name)
}

// driverOf is a driver's constructors over one config.
func driverOf[C any, P broker.Publisher, S broker.Subscriber, I broker.Inspector](cfg C,
	newPub func(context.Context, C) (P, error), newSub, newIntake func(context.Context, C) (S, error),
	newInsp func(context.Context, C) (I, error)) brokerDriver {
	return brokerDriver{
		publisher: func(ctx context.Context) (broker.Publisher, error) { return orNil[broker.Publisher](newPub(ctx, cfg)) },
		subscriber: func(ctx context.Context, intake bool) (broker.Subscriber, error) {
			if intake {
				return orNil[broker.Subscriber](newIntake(ctx, cfg))
			}
			return orNil[broker.Subscriber](newSub(ctx, cfg))
		},
		inspector: func(ctx context.Context) (broker.Inspector, error) { return orNil[broker.Inspector](newInsp(ctx, cfg)) },
	}
}

func rabbitDriver(cfg rabbitmq.Config) brokerDriver {
	return driverOf(cfg, rabbitmq.NewPublisher, rabbitmq.NewSubscriber, rabbitmq.NewIntakeSubscriber, rabbitmq.NewInspector)
}

func kafkaDriver(cfg kafka.Config) brokerDriver {
	return driverOf(cfg, kafka.NewPublisher, kafka.NewSubscriber, kafka.NewIntakeSubscriber, kafka.NewInspector)
}

// orNil turns a driver's (*T)(nil) on error into a nil interface.
func orNil[I any](v I, err error) (I, error) {
	if err != nil {
		var zero I
		return zero, err
	}
	return v, nil
}

// connect opens every client of a real broker; the raw publisher connects
// first, so the topology exists before anything reads it.
func (b *runBroker) connect(ctx context.Context, d brokerDriver) error {
	pub := func() (broker.Publisher, error) {
		p, err := d.publisher(ctx)
		if err != nil {
			return nil, fmt.Errorf("connect %s publisher: %w", b.name, err)
		}
		return track(b, p), nil
	}
	var err error
	if b.raw, err = pub(); err != nil {
		return err
	}
	if b.lanes, err = pub(); err != nil {
		return err
	}
	if b.apiPub, err = pub(); err != nil {
		return err
	}
	insp, err := d.inspector(ctx)
	if err != nil {
		return fmt.Errorf("connect %s inspector: %w", b.name, err)
	}
	b.apiInsp = track(b, insp)
	for _, intake := range []bool{false, true} {
		s, err := d.subscriber(ctx, intake)
		if err != nil {
			return fmt.Errorf("connect %s subscriber: %w", b.name, err)
		}
		if intake {
			b.intake = track(b, s)
		} else {
			b.sub = track(b, s)
		}
	}
	return nil
}

// track closes c with the broker.
func track[C io.Closer](b *runBroker, c C) C {
	b.onClose(func() { _ = c.Close() })
	return c
}

func (b *runBroker) onClose(f func()) { b.closers = append(b.closers, f) }

// close closes the clients, then removes what the run made on the broker.
func (b *runBroker) close() {
	for _, f := range slices.Backward(b.closers) {
		f()
	}
	b.closers = nil
}

// freshVhost creates a vhost of its own on the RabbitMQ of base with
// rabbitmqctl (llmq's names on a vhost are fixed; the broker's AMQP port
// cannot create vhosts), grants base's user everything on it, and returns
// its URL and a func that deletes it, as the repository's integration
// tests do.
func freshVhost(base string) (string, func(), error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, fmt.Errorf("parse LLMQ_AMQP_URL: %w", err)
	}
	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		return "", nil, fmt.Errorf("--broker rabbitmq gives each run a vhost of its own with rabbitmqctl, next to the broker of LLMQ_AMQP_URL: %w", err)
	}
	run := func(args ...string) error {
		if out, err := exec.Command(ctl, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	vhost := "llmq-bench-" + randomHex(4)
	if err := run("add_vhost", vhost); err != nil {
		return "", nil, err
	}
	drop := func() { _ = run("delete_vhost", vhost) }
	user := u.User.Username()
	if user == "" {
		user = "guest"
	}
	if err := run("set_permissions", "-p", vhost, user, ".*", ".*", ".*"); err != nil {
		drop()
		return "", nil, err
	}
	u.Path, u.RawPath = "/"+vhost, ""
	return u.String(), drop, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
