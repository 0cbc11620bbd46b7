package testsvc

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
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

	"github.com/llmq/llmq/internal/pgcodec"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/migrations"
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
// ends, and returns its connection string. The database is a copy of a
// template database that holds the current migrations (built once per
// server and migration set, see pgTemplate), so a test does not pay for
// migrating.
func PostgresURL(t testing.TB) string {
	t.Helper()
	server := pgServer(t)
	return pgCreate(t, server, pgTemplate(t, server))
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
	return pgCreate(t, pgServer(t), "")
}

// pgCreate creates database llmq_test_<random> on server, copied from
// template when it is not "", and drops it (WITH FORCE) when the test ends.
func pgCreate(t testing.TB, server, template string) string {
	t.Helper()
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
	create := "CREATE DATABASE " + name
	if template != "" {
		create += " TEMPLATE " + template
	}
	if _, err := admin.Exec(ctx, create); err != nil {
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

// pgTemplates remembers, per server, the template database this process
// built or found.
var pgTemplates struct {
	mu    sync.Mutex
	names map[string]string
}

// pgTemplateLock serialises template builds across processes (test
// binaries of several packages run at once).
const pgTemplateLock = 0x6c6c6d71_74706c00

// pgTemplate returns the name of a database that holds exactly the current
// embedded migrations: llmq_tpl_<hash of the migration files>. The first
// test process to need it builds it under an advisory lock: it migrates a
// scratch database, then renames it into place and closes it to
// connections, so a template is never seen half-built. Templates of older
// migration sets stay on the server (a few MB each); drop llmq_tpl_*
// databases to reclaim them.
func pgTemplate(t testing.TB, server string) string {
	t.Helper()
	pgTemplates.mu.Lock()
	defer pgTemplates.mu.Unlock()
	if name, ok := pgTemplates.names[server]; ok {
		return name
	}
	name, err := pgBuildTemplate(server)
	if err != nil {
		t.Fatalf("testsvc: build template database: %v", err)
	}
	if pgTemplates.names == nil {
		pgTemplates.names = map[string]string{}
	}
	pgTemplates.names[server] = name
	return name
}

func pgBuildTemplate(server string) (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(migrations.FS, path)
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(data))
		h.Write(data)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("hash migrations: %w", err)
	}
	name := "llmq_tpl_" + hex.EncodeToString(h.Sum(nil))[:16]
	building := name + "_building"

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return "", fmt.Errorf("connect to Postgres at %s: %w", pgRedact(server), err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(pgTemplateLock)); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", int64(pgTemplateLock)) //nolint:errcheck

	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("look up %s: %w", name, err)
	}
	if exists {
		return name, nil
	}
	// A build that died half-way leaves a scratch database behind.
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+building+" WITH (FORCE)"); err != nil {
		return "", fmt.Errorf("drop stale %s: %w", building, err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+building); err != nil {
		return "", fmt.Errorf("create %s: %w", building, err)
	}
	u, err := pgWithDatabase(server, building)
	if err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", building, err)
	}
	err = store.Migrate(ctx, pool)
	pool.Close() // a template must have no connections when it is copied
	if err != nil {
		return "", fmt.Errorf("migrate %s: %w", building, err)
	}
	for _, stmt := range []string{
		"ALTER DATABASE " + building + " RENAME TO " + name,
		"ALTER DATABASE " + name + " WITH ALLOW_CONNECTIONS false",
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			return "", fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return name, nil
}

// pgConnect opens a pool closed at the end of the test (before the database
// is dropped: cleanups run last-in first-out); tune adjusts its
// configuration.
func pgConnect(t testing.TB, u string, tune ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatalf("testsvc: parse %s: %v", pgRedact(u), err)
	}
	for _, f := range tune {
		f(cfg)
	}
	pgcodec.Configure(cfg) // after tune: it keeps an AfterConnect tune set
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testsvc: open pool on %s: %v", pgRedact(u), err)
	}
	t.Cleanup(func() {
		if err := closeWithin(pool, poolCloseWait); err != nil {
			t.Errorf("testsvc: %s: %v", pgRedact(u), err)
		}
	})
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("testsvc: ping %s: %v", pgRedact(u), err)
	}
	return pool
}

// poolCloseWait is how long a test's pool may take to close: every
// connection is idle once the test's own work has ended.
const poolCloseWait = 30 * time.Second

// closeWithin closes pool, or reports after d that a connection is still
// in use. pgxpool's Close waits for every acquired connection: a test that
// failed while it held one (a transaction left open, a parked lock) would
// otherwise hang at its cleanup instead of failing. The database's drop,
// which runs next, ends that connection's backend.
func closeWithin(pool *pgxpool.Pool, d time.Duration) error {
	done := make(chan struct{})
	go func() {
		pool.Close()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("the pool did not close within %v: %d connection(s) still acquired, a transaction the test left open", d, pool.Stat().AcquiredConns())
	}
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
