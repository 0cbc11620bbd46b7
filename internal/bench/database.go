package bench

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/pgcodec"
	"github.com/llmq/llmq/internal/store"
)

// FreshDatabase creates llmq_bench_<random> on the server, migrates it and
// returns a pool on it with a func that closes the pool and drops it.
func FreshDatabase(ctx context.Context, serverURL string) (*pgxpool.Pool, func(), error) {
	admin, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to Postgres (LLMQ_POSTGRES_URL=%s): %w", redact(serverURL), err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	name := "llmq_bench_" + randomHex(6)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, nil, fmt.Errorf("create database %s: %w", name, err)
	}
	dropDB := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(dctx, serverURL)
		if err != nil {
			return
		}
		defer conn.Close(dctx)
		_, _ = conn.Exec(dctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		dropDB()
		return nil, nil, fmt.Errorf("parse Postgres URL: %w", err)
	}
	u.Path = "/" + name
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		dropDB()
		return nil, nil, fmt.Errorf("parse Postgres URL: %w", err)
	}
	pcfg.MaxConns = 8
	pgcodec.Configure(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		dropDB()
		return nil, nil, fmt.Errorf("connect to %s: %w", name, err)
	}
	if err := store.Migrate(ctx, pool); err != nil {
		pool.Close()
		dropDB()
		return nil, nil, fmt.Errorf("migrate %s: %w", name, err)
	}
	return pool, func() { pool.Close(); dropDB() }, nil
}

// redact hides a password in a connection URL.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparseable URL)"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}
