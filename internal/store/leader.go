package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ReconcilerLockID is the advisory lock that elects the one active
// reconciler among consumer replicas (see Store.TryLead).
const ReconcilerLockID = 0x6c6c6d71_00000003

// Lease is a Postgres session advisory lock held on a connection of its
// own: it lasts until Release, or until that connection dies (a crashed
// replica's lock is freed by Postgres when its session ends).
type Lease struct {
	conn *pgx.Conn
	id   int64
}

// TryLead takes the advisory lock id without waiting. It returns nil and no
// error when another session holds it.
func (s *Store) TryLead(ctx context.Context, id int64) (*Lease, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("try lead: connect: %w", err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, id).Scan(&ok); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("try lead: %w", err)
	}
	if !ok {
		conn.Close(context.WithoutCancel(ctx))
		return nil, nil
	}
	return &Lease{conn: conn, id: id}, nil
}

// Check reports whether the lease still holds: its session answers and
// still holds the lock.
func (l *Lease) Check(ctx context.Context) error {
	var held bool
	err := l.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
		WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
		  AND ((classid::bigint << 32) | objid::bigint) = $1)`, l.id).Scan(&held)
	if err != nil {
		return fmt.Errorf("lease check: %w", err)
	}
	if !held {
		return fmt.Errorf("lease check: lock %d is no longer held", l.id)
	}
	return nil
}

// Release unlocks and closes the lease's connection.
func (l *Lease) Release(ctx context.Context) {
	_, _ = l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, l.id)
	_ = l.conn.Close(ctx)
}

// LeadEvery tries to take the advisory lock id every interval and, each
// time it does, calls lead with the lease and the ticker (lead returns when
// it loses the lease or ctx ends; the lease is released after it). A
// failed try is passed to tryFailed. It returns when ctx ends.
func LeadEvery(ctx context.Context, try func(ctx context.Context, id int64) (*Lease, error), id int64,
	interval time.Duration, tryFailed func(error), lead func(ctx context.Context, lease *Lease, tick *time.Ticker)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		lease, err := try(ctx, id)
		switch {
		case err != nil && ctx.Err() == nil:
			tryFailed(err)
		case lease != nil:
			func() {
				defer lease.Release(context.WithoutCancel(ctx))
				lead(ctx, lease, tick)
			}()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
