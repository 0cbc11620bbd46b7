package testsvc

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestPostgresDatabasesAreFreshMigratedAndSeparate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := Postgres(t), Postgres(t)
	var nameA, nameB string
	if err := a.QueryRow(ctx, "SELECT current_database()").Scan(&nameA); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, "SELECT current_database()").Scan(&nameB); err != nil {
		t.Fatal(err)
	}
	if nameA == nameB {
		t.Fatalf("two calls share database %s", nameA)
	}
	if _, err := a.Exec(ctx, `INSERT INTO jobs (tenant, id, model, request) VALUES ('t', 'x', 'm', '{}')`); err != nil {
		t.Fatalf("migrated database has no usable jobs table: %v", err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM jobs").Scan(&n); err != nil || n != 0 {
		t.Fatalf("other database sees %d jobs (err %v), want 0", n, err)
	}
}

func TestPostgresEmptyHasNoTables(t *testing.T) {
	t.Parallel()
	var n int
	err := PostgresEmpty(t).QueryRow(context.Background(),
		"SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'").Scan(&n)
	if err != nil || n != 0 {
		t.Fatalf("empty database has %d tables (err %v)", n, err)
	}
}

func TestPostgresDatabaseDroppedAfterTest(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("inner", func(t *testing.T) {
		if err := PostgresEmpty(t).QueryRow(context.Background(), "SELECT current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
	})
	admin := pgConnect(t, pgServer(t))
	var exists bool
	if err := admin.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("database %s still exists after its test ended", name)
	}
}

// fatalRecorder stands in for a test to observe a Fatal.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}
func (f *fatalRecorder) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}
func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestPostgresWithoutServiceFailsNamingTheVariable(t *testing.T) {
	t.Setenv(EnvPostgresURL, "")
	if pgDockerHealthy() {
		t.Skip("a Docker engine answers here, so an unset " + EnvPostgresURL + " starts a container instead of failing")
	}
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pgServer(rec)
	}()
	<-done
	if rec.msg != pgNoServer {
		t.Fatalf("without a service: got %q, want %q", rec.msg, pgNoServer)
	}
}

// TestAPoolWithAConnectionInUseDoesNotHangItsCleanup: a test that fails
// while it holds a connection (a parked lock's transaction) reports it at
// its cleanup instead of waiting there for ever.
func TestAPoolWithAConnectionInUseDoesNotHangItsCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgConnect(t, PostgresEmptyURL(t))
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = closeWithin(pool, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "1 connection(s) still acquired") {
		t.Fatalf("closing with a transaction open: %v, want the acquired connection named", err)
	}
	_ = tx.Rollback(ctx)
	conn.Release() // the Close closeWithin started then ends
}
