// Package localpg finds or starts the Postgres that `llmq up` uses: the
// configured URL when it answers, else the machine's local server, else a
// throwaway server of its own. The throwaway server uses the installed
// Postgres binaries when there are any (run as an unprivileged user when
// llmq runs as root, since initdb refuses root) and otherwise
// fergusstrange/embedded-postgres, which downloads them.
package localpg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"
	"github.com/jackc/pgx/v5"
)

// LocalURL is the machine-local server tried when no URL is configured.
const LocalURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Server is a Postgres llmq can use; Stop releases what Find started.
type Server struct {
	URL    string
	Source string // "configured", "local" or "embedded"
	stop   func() error
}

// Stop shuts down a server Find started; it is a no-op for others.
func (s *Server) Stop() error {
	if s.stop == nil {
		return nil
	}
	return s.stop()
}

// Find returns the first Postgres that answers: configured (if not empty),
// then LocalURL, then a throwaway server with its data under dir.
func Find(ctx context.Context, configured, dir string, log io.Writer) (*Server, error) {
	if configured != "" {
		if err := ping(ctx, configured); err != nil {
			return nil, fmt.Errorf("postgres_url does not answer: %w", err)
		}
		return &Server{URL: configured, Source: "configured"}, nil
	}
	if ping(ctx, LocalURL) == nil {
		return &Server{URL: LocalURL, Source: "local"}, nil
	}
	return Start(ctx, dir, log)
}

func ping(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

// Start runs a throwaway server with its data under dir.
func Start(ctx context.Context, dir string, log io.Writer) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	if bin := installedBinaries(); bin != "" {
		return startInstalled(ctx, bin, dir, port, log)
	}
	if os.Geteuid() == 0 {
		return nil, errors.New("no Postgres answers and none is installed: embedded Postgres cannot run as root; set LLMQ_POSTGRES_URL")
	}
	cfg := embeddedpostgres.DefaultConfig().Port(uint32(port)).
		DataPath(filepath.Join(dir, "data")).RuntimePath(filepath.Join(dir, "run")).Logger(log).
		StartTimeout(60 * time.Second)
	ep := embeddedpostgres.NewDatabase(cfg)
	if err := ep.Start(); err != nil {
		return nil, fmt.Errorf("embedded postgres: %w", err)
	}
	return &Server{URL: cfg.GetConnectionURL() + "?sslmode=disable", Source: "embedded", stop: ep.Stop}, nil
}

// installedBinaries returns the newest Debian-style Postgres bin directory.
func installedBinaries() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Strings(dirs)
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i]
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}

func startInstalled(ctx context.Context, bin, dir string, port int, log io.Writer) (*Server, error) {
	data := filepath.Join(dir, "pgdata")
	cred, err := unprivileged()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	command := func(name string, args ...string) *exec.Cmd {
		c := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
		c.Stdout, c.Stderr = log, log
		if cred != nil {
			c.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		return c
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		if err := command("initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8").Run(); err != nil {
			return nil, fmt.Errorf("initdb: %w", err)
		}
	}
	srv := command("postgres", "-D", data, "-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1")
	// The server outlives ctx's cancellation until Stop: Stop sends SIGINT (fast shutdown).
	srv.Cancel = func() error { return srv.Process.Signal(os.Interrupt) }
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	deadline := time.Now().Add(60 * time.Second)
	for ping(ctx, url) != nil {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("postgres exited at start: %v", err)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = srv.Process.Kill()
			return nil, errors.New("postgres did not answer within 60s")
		}
	}
	stop := func() error {
		_ = srv.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = srv.Process.Kill()
			<-exited
		}
		return nil
	}
	return &Server{URL: url, Source: "embedded", stop: stop}, nil
}

// unprivileged returns the credential to run Postgres under when llmq runs
// as root (initdb refuses root), or nil when it does not.
func unprivileged() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root and no unprivileged user (postgres, nobody) to run Postgres as")
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
