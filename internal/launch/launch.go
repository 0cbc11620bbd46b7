// Package launch assembles llmq's processes from a config.Config: the
// producer API and the consumer, with their Postgres pool, broker clients,
// metrics and health endpoints. cmd/producer, cmd/consumer and `llmq up`
// share it, so a process started alone and one started inside `llmq up` are
// built the same way.
package launch

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/segmentio/kafka-go/sasl"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/gcfloor"
	"github.com/llmq/llmq/internal/pgcodec"
	"github.com/llmq/llmq/internal/store"
)

// Options are what a caller may add to a process besides its config.
type Options struct {
	Logger *slog.Logger
	// Ready, when set, hears the address the process listens on once it
	// serves (the API address, or the consumer's metrics address).
	Ready func(addr string)
	// ProviderTransport replaces the provider client's HTTP transport (an
	// in-process simulator); nil uses the network.
	ProviderTransport http.RoundTripper
	// Failpoint is handed to the worker or the API (TEST-ONLY crash points,
	// see worker.ParseFailpoint and api.FailpointReplayAfterCommit); nil in
	// production.
	Failpoint func(name string)
	// TracerProvider traces the process's jobs (cmd/* build it with
	// telemetry.FromEnv); nil is tracing off.
	TracerProvider trace.TracerProvider
}

func (o Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

// poolIdleTime is how long a pooled Postgres connection may stay idle
// before the pool closes it (pool_max_conn_idle_time in the URL overrides).
const poolIdleTime = time.Minute

// Pool opens a pgx pool with at least minConns connections (unless the URL
// sets pool_max_conns) and migrates the database.
func Pool(ctx context.Context, url string, minConns int32) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, errors.New("config: postgres_url (LLMQ_POSTGRES_URL) is required")
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errors.New("config: postgres_url: cannot be parsed") // the URL may hold a password
	}
	if !strings.Contains(url, "pool_max_conns") {
		pcfg.MaxConns = max(pcfg.MaxConns, minConns)
	}
	if !strings.Contains(url, "pool_max_conn_idle_time") {
		// pgx keeps an idle connection 30 minutes: the connections a burst
		// opened (a takeover of a killed replica's work, the reconnect
		// after a restart) would hold their buffers and statement caches
		// that long.
		pcfg.MaxConnIdleTime = poolIdleTime
	}
	pgcodec.Configure(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect postgres: %w", err)
	}
	if err := store.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// Publisher connects a publisher and an inspector to the configured broker.
func Publisher(ctx context.Context, cfg config.Config, log *slog.Logger) (broker.Publisher, broker.Inspector, error) {
	switch cfg.Broker {
	case "kafka":
		kc, err := kafkaConfig(cfg, log)
		if err != nil {
			return nil, nil, err
		}
		pub, err := kafka.NewPublisher(ctx, kc)
		if err != nil {
			return nil, nil, err
		}
		insp, err := kafka.NewInspector(ctx, kc)
		if err != nil {
			_ = pub.Close()
			return nil, nil, err
		}
		return pub, insp, nil
	default:
		rc := rabbitConfig(cfg, log)
		pub, err := rabbitmq.NewPublisher(ctx, rc)
		if err != nil {
			return nil, nil, err
		}
		insp, err := rabbitmq.NewInspector(ctx, rc)
		if err != nil {
			_ = pub.Close()
			return nil, nil, err
		}
		return pub, insp, nil
	}
}

// DeclareIntake makes sure llmq's names exist on the configured broker
// (the RabbitMQ topology, the Kafka topics), as every llmq process does
// when it connects. A tool that then publishes as any producer would, over
// the public client package, calls it first (producer submit).
func DeclareIntake(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	var (
		pub broker.Publisher
		err error
	)
	if cfg.Broker == "kafka" {
		var kc kafka.Config
		if kc, err = kafkaConfig(cfg, log); err != nil {
			return err
		}
		pub, err = kafka.NewPublisher(ctx, kc)
	} else {
		pub, err = rabbitmq.NewPublisher(ctx, rabbitConfig(cfg, log))
	}
	if err != nil {
		return err
	}
	return pub.Close()
}

// Subscriber connects a subscriber and an inspector (the readiness probe)
// to the configured broker.
func Subscriber(ctx context.Context, cfg config.Config, log *slog.Logger) (broker.Subscriber, broker.Inspector, error) {
	var (
		sub  broker.Subscriber
		insp broker.Inspector
		err  error
	)
	switch cfg.Broker {
	case "kafka":
		kc, err := kafkaConfig(cfg, log)
		if err != nil {
			return nil, nil, err
		}
		if sub, err = kafka.NewSubscriber(ctx, kc); err != nil {
			return nil, nil, err
		}
		if insp, err = kafka.NewInspector(ctx, kc); err != nil {
			sub.Close()
			return nil, nil, err
		}
	default:
		rc := rabbitConfig(cfg, log)
		if sub, err = rabbitmq.NewSubscriber(ctx, rc); err != nil {
			return nil, nil, err
		}
		if insp, err = rabbitmq.NewInspector(ctx, rc); err != nil {
			sub.Close()
			return nil, nil, err
		}
	}
	return sub, insp, nil
}

// IntakeSubscriber connects a subscriber of the public intake, which the
// ingester reads.
func IntakeSubscriber(ctx context.Context, cfg config.Config, log *slog.Logger) (broker.Subscriber, error) {
	if cfg.Broker == "kafka" {
		kc, err := kafkaConfig(cfg, log)
		if err != nil {
			return nil, err
		}
		return kafka.NewIntakeSubscriber(ctx, kc)
	}
	return rabbitmq.NewIntakeSubscriber(ctx, rabbitConfig(cfg, log))
}

// kafkaConfig is the Kafka driver's config: the tenants with broker users
// get intake topics of their own (docs/design.md#broker-identity); TLS,
// SASL and topic settings come from kafka.* and apply to every client.
func kafkaConfig(cfg config.Config, log *slog.Logger) (kafka.Config, error) {
	var tenants []string
	for name, t := range cfg.Tenants {
		if len(t.BrokerUsers) > 0 {
			tenants = append(tenants, name)
		}
	}
	sort.Strings(tenants)
	k := cfg.Kafka
	kc := kafka.Config{Brokers: cfg.KafkaBrokers, Logger: log, TenantTopics: tenants,
		Partitions: k.Partitions, ReplicationFactor: k.ReplicationFactor, MinInsyncReplicas: k.MinInsyncReplicas,
		DeadRetention: cfg.Retention.Dead}
	var err error
	kc.TLS, kc.SASL, err = KafkaSecurity(cfg)
	return kc, err
}

// KafkaSecurity is the TLS configuration and SASL mechanism of kafka.tls
// and kafka.sasl (nil when off), for every Kafka client llmq makes.
func KafkaSecurity(cfg config.Config) (*tls.Config, sasl.Mechanism, error) {
	var (
		tc  *tls.Config
		m   sasl.Mechanism
		err error
	)
	k := cfg.Kafka
	if k.TLS.Enabled {
		if tc, err = kafka.TLSConfig(k.TLS.CAFile, k.TLS.CertFile, k.TLS.KeyFile, k.TLS.InsecureSkipVerify); err != nil {
			return nil, nil, fmt.Errorf("config: kafka.tls: %w", err)
		}
	}
	if k.SASL.Mechanism != "" {
		if m, err = kafka.SASL(k.SASL.Mechanism, k.SASL.Username, k.SASL.Password.Reveal()); err != nil {
			return nil, nil, fmt.Errorf("config: kafka.sasl: %w", err)
		}
	}
	return tc, m, nil
}

func rabbitConfig(cfg config.Config, log *slog.Logger) rabbitmq.Config {
	return rabbitmq.Config{URL: cfg.AMQPURL.Reveal(), MaxLength: int(cfg.Backpressure.LaneMaxLength), Logger: log}
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveHTTP serves h on addr until ctx ends, then shuts down gracefully.
func serveHTTP(ctx context.Context, addr string, h http.Handler, log *slog.Logger, ready func(string)) (wait func() error, err error) {
	ln, err := listen(addr)
	if err != nil {
		return nil, err
	}
	return serveOn(ctx, ln, h, log, ready)
}

// listen binds addr. A process that binds its port before it dials
// anything cannot lose the port to one of its own outgoing connections
// (an ephemeral port may be any free port of the range), and fails on a
// taken port before it has connected to everything else.
func listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// serveOn is serveHTTP on a listener already bound; it owns ln.
func serveOn(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger, ready func(string)) (wait func() error, err error) {
	addr := ln.Addr().String()
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr().String())
	}
	return func() error {
		select {
		case <-ctx.Done():
		case err := <-done:
			if !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", addr, err)
			}
			return nil
		}
		shutCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := hs.Shutdown(shutCtx); err != nil {
			log.Warn("http shutdown", "addr", addr, "error", err)
		}
		<-done
		return nil
	}, nil
}

// holdHeapFloor runs gcfloor for the life of a consumer or producer; the
// returned stop ends it and waits.
func holdHeapFloor(ctx context.Context, cfg config.Config) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		gcfloor.Run(ctx, cfg.GCHeapFloor())
	}()
	return func() { cancel(); <-done }
}
