package rabbitmq

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
)

// session owns one AMQP connection and replaces it, topology included,
// whenever it is found dead. Dialing is lazy: whoever needs the connection
// redials, with backoff, one at a time.
type session struct {
	cfg   Config
	names names
	role  string

	lock chan struct{} // one slot: held while reading or replacing conn
	conn *amqp.Connection

	closeOnce sync.Once
	done      chan struct{}
}

func newSession(cfg Config, role string) *session {
	return &session{cfg: cfg, names: newNames(cfg.Prefix), role: role,
		lock: make(chan struct{}, 1), done: make(chan struct{})}
}

// connection returns a live connection, dialing (and declaring the
// topology) until one answers, ctx ends or the session closes.
func (s *session) connection(ctx context.Context) (*amqp.Connection, error) {
	select {
	case s.lock <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.done:
		return nil, broker.ErrClosed
	}
	defer func() { <-s.lock }()
	select {
	case <-s.done:
		return nil, broker.ErrClosed
	default:
	}
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn, nil
	}
	wait := s.cfg.ReconnectMin
	for attempt := 1; ; attempt++ {
		conn, err := s.dial()
		if err == nil {
			s.conn = conn
			if attempt > 1 {
				s.cfg.Logger.Info("rabbitmq connected", "role", s.role, "attempt", attempt)
			}
			return conn, nil
		}
		s.cfg.Logger.Warn("rabbitmq connect failed", "role", s.role, "attempt", attempt,
			"host", redactedHost(s.cfg.URL), "error", err)
		// Full jitter between wait/2 and wait.
		d := wait/2 + rand.N(wait/2+1)
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("rabbitmq connect: %w (last error: %v)", ctx.Err(), err)
		case <-s.done:
			timer.Stop()
			return nil, broker.ErrClosed
		}
		wait = min(wait*2, s.cfg.ReconnectMax)
	}
}

func (s *session) dial() (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("llmq-" + s.role)
	conn, err := amqp.DialConfig(s.cfg.URL, amqp.Config{Heartbeat: s.cfg.Heartbeat, Properties: props})
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	if err := declareTopology(conn, s.cfg, s.names); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// close closes the connection: the broker takes back every unacked delivery.
func (s *session) close() {
	s.closeOnce.Do(func() {
		close(s.done)
		s.lock <- struct{}{}
		if s.conn != nil {
			_ = s.conn.Close()
		}
		<-s.lock
	})
}

// backoff waits before retrying an operation; false when ctx or the session
// ended first.
func (s *session) backoff(ctx context.Context, attempt int) bool {
	d := min(s.cfg.ReconnectMin<<min(attempt, 10), s.cfg.ReconnectMax)
	d = d/2 + rand.N(d/2+1)
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	case <-s.done:
		return false
	}
}

// redactedHost is the URL's host alone: credentials never reach logs.
func redactedHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "invalid-url"
	}
	return u.Host
}
