package testsvc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/llmq/llmq/internal/store"
)

// EnvPostgresURL names the variable that points tests at a Postgres server.
const EnvPostgresURL = "LLMQ_TEST_POSTGRES_URL"

const pgNoServer = "no Postgres: set LLMQ_TEST_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable) or run a Docker engine"

// Postgres returns a pool on a fresh database of its own, with llmq's
// migrations applied. The database is dropped when the test ends.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return pgConnect(t, PostgresURL(t))
}

// PostgresURL creates a fresh migrated database, dropped when the test
// ends, and returns its connection string.
func PostgresURL(t testing.TB) string {
	t.Helper()
	u := PostgresEmptyURL(t)
	pool := pgConnect(t, u)
	defer pool.Close()
	if err := store.Migrate(context.Background(), pool); err != nil {
		t.Fatalf("testsvc: migrate test database: %v", err)
	}
	return u
}

// PostgresEmpty returns a pool on a fresh, empty database (no migrations),
// dropped when the test ends.
func PostgresEmpty(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return pgConnect(t, PostgresEmptyURL(t))
}

// PostgresEmptyURL creates a fresh empty database, dropped when the test
// ends, and returns its connection string.
func PostgresEmptyURL(t testing.TB) string {
	t.Helper()
	server := pgServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatalf("testsvc: connect to Postgres at %s: %v", pgRedact(server), err)
	}
	defer admin.Close(context.Background())

	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "llmq_test_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testsvc: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, server)
		if err != nil {
			t.Errorf("testsvc: drop database %s: %v", name, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("testsvc: drop database %s: %v", name, err)
		}
	})
	u, err := pgWithDatabase(server, name)
	if err != nil {
		t.Fatalf("testsvc: %s: %v", EnvPostgresURL, err)
	}
	return u
}

// pgConnect opens a pool closed at the end of the test (before the database
// is dropped: cleanups run last-in first-out).
func pgConnect(t testing.TB, u string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatalf("testsvc: open pool on %s: %v", pgRedact(u), err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("testsvc: ping %s: %v", pgRedact(u), err)
	}
	return pool
}

// pgWithDatabase returns the connection string u pointed at database name;
// u is a URL (postgres://…) or a keyword/value string (host=… user=…).
func pgWithDatabase(u, name string) (string, error) {
	if strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://") {
		p, err := url.Parse(u)
		if err != nil {
			return "", fmt.Errorf("parse Postgres URL: %w", err)
		}
		p.Path = "/" + name
		p.RawPath = ""
		return p.String(), nil
	}
	return u + " dbname=" + name, nil
}

// pgRedact hides a password in a URL for messages.
func pgRedact(u string) string {
	if p, err := url.Parse(u); err == nil && p.User != nil {
		return p.Redacted()
	}
	return "the configured server"
}

// The container, when one is needed, is shared by every test of the
// process and removed by testcontainers' reaper when the process exits.
var pgContainer struct {
	once sync.Once
	url  string
	err  error
}

// pgServer returns the URL of a Postgres server: LLMQ_TEST_POSTGRES_URL,
// else a testcontainers container when a Docker engine answers, else it
// fails the test naming the variable.
func pgServer(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(EnvPostgresURL); u != "" {
		return u
	}
	if !pgDockerHealthy() {
		t.Fatal(pgNoServer)
	}
	pgContainer.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c, err := tcpostgres.Run(ctx, "postgres:16-alpine",
			tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"), tcpostgres.WithDatabase("postgres"),
			tcpostgres.BasicWaitStrategies())
		if err != nil {
			pgContainer.err = err
			return
		}
		pgContainer.url, pgContainer.err = c.ConnectionString(ctx, "sslmode=disable")
	})
	if pgContainer.err != nil {
		t.Fatalf("testsvc: start Postgres container (%s unset): %v", EnvPostgresURL, pgContainer.err)
	}
	return pgContainer.url
}

// pgDockerHealthy reports whether a Docker engine answers, as
// testcontainers.SkipIfProviderIsNotHealthy checks it, without skipping.
func pgDockerHealthy() (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	provider, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return false
	}
	defer provider.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return provider.Health(ctx) == nil
}
