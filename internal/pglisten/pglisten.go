// Package pglisten holds one Postgres connection in LISTEN on a channel for
// a process's life, reconnecting after a failure: the job-finished
// notifications of the producer (internal/finished) and the cancellations
// of the consumer (store.ListenCancels) both live on it.
package pglisten

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// Loop is one LISTEN that lasts. Connect and Channel are required; the
// callbacks may be nil.
type Loop struct {
	// Connect opens the listening connection: a connection of its own, not
	// one of a pool, since it stays in LISTEN.
	Connect func(ctx context.Context) (*pgx.Conn, error)
	Channel string
	// MinBackoff and MaxBackoff bound the wait between reconnects
	// (defaults 100 ms and 10 s); the wait doubles while reconnects fail,
	// with jitter, and starts over after a connection that lasted.
	MinBackoff, MaxBackoff time.Duration
	// OnUp is called once each connection listens: a notification sent
	// before it may have been missed.
	OnUp func()
	// OnPayload is called with every notification's payload, in order.
	OnPayload func(payload string)
	// OnDown is called after each connection ends, also at shutdown.
	OnDown func()
	// OnRetry is called before the wait that follows a lost connection.
	OnRetry func(err error, backoff time.Duration)
}

// Run listens until ctx ends.
func (l Loop) Run(ctx context.Context) {
	minB, maxB := l.MinBackoff, l.MaxBackoff
	if minB <= 0 {
		minB = 100 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = 10 * time.Second
	}
	maxB = max(maxB, minB)
	backoff := minB
	for ctx.Err() == nil {
		start := time.Now()
		err := l.listen(ctx)
		if l.OnDown != nil {
			l.OnDown()
		}
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > maxB {
			backoff = minB // it was up a while: a new outage
		}
		if l.OnRetry != nil {
			l.OnRetry(err, backoff)
		}
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, maxB)
	}
}

// listen holds one connection in LISTEN until it fails or ctx ends.
func (l Loop) listen(ctx context.Context) error {
	conn, err := l.Connect(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // the connection is being dropped
	// Channel is one of llmq's own constants, never user input.
	if _, err := conn.Exec(ctx, "LISTEN "+l.Channel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if l.OnUp != nil {
		l.OnUp()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		if l.OnPayload != nil {
			l.OnPayload(n.Payload)
		}
	}
}
