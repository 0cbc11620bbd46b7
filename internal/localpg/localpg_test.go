package localpg

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"
)

// The throwaway server really starts, answers SQL and stops; as root this
// exercises running initdb and postgres as an unprivileged user.
func TestStartThrowawayServer(t *testing.T) {
	if installedBinaries() == "" && os.Geteuid() == 0 {
		t.Fatal("no installed Postgres binaries and running as root: install postgresql (apt-get install postgresql) to run this test")
	}
	dir, err := os.MkdirTemp("", "llmq-localpg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := Start(ctx, dir+"/pg", &log)
	if err != nil {
		t.Fatalf("start: %v\n%s", err, log.String())
	}
	if err := ping(ctx, srv.URL); err != nil {
		t.Fatalf("ping %s: %v", srv.URL, err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if ping(ctx, srv.URL) == nil {
		t.Fatal("server still answers after Stop")
	}
}

func TestFindPrefersConfigured(t *testing.T) {
	url := os.Getenv("LLMQ_TEST_POSTGRES_URL")
	if url == "" {
		t.Fatal("set LLMQ_TEST_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)")
	}
	srv, err := Find(context.Background(), url, t.TempDir(), nil)
	if err != nil || srv.Source != "configured" || srv.URL != url {
		t.Fatalf("Find = %+v, %v", srv, err)
	}
	if _, err := Find(context.Background(), "postgres://nobody@127.0.0.1:1/x?connect_timeout=1", t.TempDir(), nil); err == nil {
		t.Fatal("a configured URL that does not answer was accepted")
	}
}
