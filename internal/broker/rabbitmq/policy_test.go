package rabbitmq_test

import (
	"context"
	"net"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/brokertest"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/testsvc"
)

// probeID marks the messages breakPublishes publishes to see whether the
// broker accepts publishes to a queue.
const probeID = "llmq-policy-probe"

// breakPublishes makes the broker refuse publishes to the queues (all
// named by pattern) with a real policy, max-length 0 with reject-publish, as
// an operator's mistake would, and returns once a publish to each is
// refused. restore (also run in t.Cleanup) returns once they are accepted
// again and the policy is gone.
func breakPublishes(t *testing.T, cfg rabbitmq.Config, policy, pattern string, queues []string) (restore func()) {
	t.Helper()
	requireRabbitmqctl(t, cfg.URL)
	ctx, cancel := context.WithTimeout(context.Background(), brokertest.Wait)
	defer cancel()
	p := newProber(t, cfg.URL)
	if err := testsvc.RabbitMQCtl(ctx, "set_policy", "--apply-to", "queues", policy, pattern,
		`{"max-length":0,"overflow":"reject-publish"}`); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			defer p.close()
			ctx, cancel := context.WithTimeout(context.Background(), brokertest.Wait)
			defer cancel()
			// Raising the limit before clearing it makes the queues tell the
			// channels they rejected to publish again; a policy cleared from
			// under a rejecting quorum queue leaves them rejecting
			// (RabbitMQ 3.10).
			if err := testsvc.RabbitMQCtl(ctx, "set_policy", "--apply-to", "queues", policy, pattern,
				`{"max-length":1000000000,"overflow":"reject-publish"}`); err != nil {
				t.Error(err)
			}
			for _, q := range queues {
				p.waitFor(t, ctx, q, true)
			}
			if err := testsvc.RabbitMQCtl(ctx, "clear_policy", policy); err != nil {
				t.Error(err)
			}
			for _, q := range queues {
				p.removeProbes(t, q)
			}
		})
	}
	t.Cleanup(restore)
	// RabbitMQ applies a policy asynchronously; a quorum queue at its limit
	// may also take one message more before it rejects.
	for _, q := range queues {
		p.waitFor(t, ctx, q, false)
	}
	return restore
}

// requireRabbitmqctl fails the test when rabbitmqctl is missing, or skips
// it when it could not reach the broker under test anyway.
func requireRabbitmqctl(t *testing.T, amqpURL string) {
	t.Helper()
	if os.Getenv(testsvc.EnvAMQPURL) == "" {
		t.Skipf("the broker runs in a container (%s unset): rabbitmqctl on this machine cannot set its policies", testsvc.EnvAMQPURL)
	}
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatalf("parse %s: %v", testsvc.EnvAMQPURL, err)
	}
	if host := u.Hostname(); host != "localhost" && !net.ParseIP(host).IsLoopback() {
		t.Skipf("the broker (%s) is not on this machine: rabbitmqctl here cannot set its policies", host)
	}
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Fatalf("rabbitmqctl is needed to set a broker policy on the local RabbitMQ: %v", err)
	}
}

// prober publishes probe messages straight to a queue (default exchange).
type prober struct {
	conn *amqp.Connection
	ch   *amqp.Channel
}

func newProber(t *testing.T, amqpURL string) *prober {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		t.Fatal(err)
	}
	return &prober{conn: conn, ch: ch}
}

func (p *prober) close() { _ = p.conn.Close() }

// waitFor publishes probes to queue until one is accepted (or, accepted
// false, refused).
func (p *prober) waitFor(t *testing.T, ctx context.Context, queue string, accepted bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false,
			amqp.Publishing{MessageId: probeID, Body: []byte("probe")})
		if err != nil {
			t.Fatalf("probe %s: %v", queue, err)
		}
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			t.Fatalf("probe %s: publishes still accepted=%v: %v", queue, !accepted, err)
		}
		if ok == accepted {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("probe %s: %v", queue, ctx.Err())
		}
	}
}

// removeProbes takes the probes at the head of queue off it (probes in a
// delay queue may have expired already: dead-lettered with a routing key
// nothing binds, they are dropped).
func (p *prober) removeProbes(t *testing.T, queue string) {
	t.Helper()
	for {
		m, ok, err := p.ch.Get(queue, false)
		if err != nil {
			t.Errorf("remove probes from %s: %v", queue, err)
			return
		}
		if !ok {
			return
		}
		if m.MessageId != probeID {
			_ = m.Nack(false, true)
			return
		}
		_ = m.Ack(false)
	}
}

// breakRetries is brokertest.Driver.BreakRetryPublishes: a policy on the
// delay queues.
func breakRetries(cfg rabbitmq.Config) func(t *testing.T) func() {
	return func(t *testing.T) func() {
		tiers := cfg.WithDefaults().RetryTiers
		queues := make([]string, 0, len(tiers))
		for _, tier := range tiers {
			queues = append(queues, cfg.Prefix+"llmq.delay."+rabbitmq.TierName(tier))
		}
		pattern := "^" + regexp.QuoteMeta(cfg.Prefix) + `llmq\.delay\.`
		return breakPublishes(t, cfg, cfg.Prefix+"break-retries", pattern, queues)
	}
}

// breakDeadLetters is brokertest.Driver.BreakDeadLetterPublishes: a policy
// on the dead-letter queue.
func breakDeadLetters(cfg rabbitmq.Config) func(t *testing.T) func() {
	return func(t *testing.T) func() {
		q := cfg.Prefix + broker.DeadLetterName
		return breakPublishes(t, cfg, cfg.Prefix+"break-dead-letters", "^"+regexp.QuoteMeta(q)+"$", []string{q})
	}
}
