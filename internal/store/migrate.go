package store

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/llmq/llmq/migrations"
)

// MigrationsTable is goose's version table for llmq's schema.
const MigrationsTable = "llmq_schema_migrations"

// Advisory lock keys (any int64 unique to llmq). Postgres advisory locks are
// per database, so tests in separate databases do not contend.
const (
	migrateLockID = 0x6c6c6d71_00000001 // outer lock held for the whole of Migrate
	gooseLockID   = 0x6c6c6d71_00000002 // goose's own session lock
)

// Migrate brings the database behind pool up to the newest embedded
// migration with goose. It is safe to call concurrently from several
// processes: a Postgres advisory lock, held on its own connection,
// serialises callers (so goose's version-table creation never races), and
// goose additionally holds its session lock while it applies migrations.
// Re-running on an up-to-date database changes nothing.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return fmt.Errorf("migrate: connect for lock: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := lockPolling(ctx, conn, migrateLockID); err != nil {
		return fmt.Errorf("migrate: take advisory lock: %w", err)
	}
	// Closing the connection also releases the lock; unlocking first keeps
	// the release prompt when the close is slow.
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(migrateLockID)) //nolint:errcheck

	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(gooseLockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("migrate: session locker: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool) // closing db leaves the pool open
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(MigrationsTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("migrate: goose provider: %w", err)
	}
	if _, err := p.UpTo(ctx, math.MaxInt64); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// lockPolling takes the advisory lock id on conn, trying every 50 ms. A
// caller blocked inside pg_advisory_lock would be a running statement, and
// CREATE INDEX CONCURRENTLY (migration 00033) waits for every statement of
// the database older than itself: the waiting callers and the migrating
// one would wait for each other for ever.
func lockPolling(ctx context.Context, conn *pgx.Conn, id int64) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", id).Scan(&ok); err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
