package integration

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/testsvc"
	"github.com/stretchr/testify/require"
)

// Package integration runs llmq's binaries as separate processes against
// real services. Each binary is built once per test run and shared.

var (
	binMu    sync.Mutex
	binPaths = map[string]string{}
	binDir   string
)

// buildCmd builds ./cmd/<name> once per test binary run and returns its path.
func buildCmd(t *testing.T, name string) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if p, ok := binPaths[name]; ok {
		return p
	}
	if binDir == "" {
		dir, err := os.MkdirTemp("", "llmq-integration-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = dir
	}
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(binDir, name)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/"+name)
	cmd.Dir = filepath.Dir(filepath.Dir(file))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/%s: %v\n%s", name, err, out)
	}
	binPaths[name] = bin
	return bin
}

// testVhost gives the test a RabbitMQ vhost of its own on base's broker
// (the binaries use the contract's exchange and queue names), deleted at
// the end. It needs rabbitmqctl next to the broker.
func testVhost(t *testing.T, base string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse %s: %v", testsvc.EnvAMQPURL, err)
	}
	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		t.Fatalf("this test isolates a vhost with rabbitmqctl on the broker of %s: %v", testsvc.EnvAMQPURL, err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	vhost := "llmq-test-" + hex.EncodeToString(b[:])
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ctl, args...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	user := u.User.Username()
	if user == "" {
		user = "guest"
	}
	run("add_vhost", vhost)
	t.Cleanup(func() { _ = exec.Command(ctl, "delete_vhost", vhost).Run() })
	run("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
	u.Path, u.RawPath = "/"+vhost, ""
	return u.String()
}

// lockedBuffer is an io.Writer a child process writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tail returns the last n lines written.
func (l *lockedBuffer) tail(n int) string {
	lines := strings.Split(strings.TrimSpace(l.String()), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// proc is one llmq binary running as a subprocess: every scenario starts
// its producers and consumers with startProc, which kills what is still
// running when the test ends.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *procOutput
	done chan struct{}
	err  error
}

func startProc(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	out := &procOutput{lines: make(chan string, 1024)}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	p := &proc{name: filepath.Base(bin), cmd: cmd, out: out, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitFor returns the first submatch of re in the process's output.
func (p *proc) waitFor(t *testing.T, re *regexp.Regexp) string {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case line := <-p.out.lines:
			if m := re.FindStringSubmatch(line); m != nil {
				return m[1]
			}
		case <-p.done:
			t.Fatalf("%s exited: %v\n%s", p.name, p.err, p.out.String())
		case <-timeout:
			t.Fatalf("%s: no line matching %s\n%s", p.name, re, p.out.String())
		}
	}
}

// procOutput collects a process's output and hands out its lines.
type procOutput struct {
	mu    sync.Mutex
	b     bytes.Buffer
	lines chan string
}

func (l *procOutput) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(p))
	for sc.Scan() {
		select {
		case l.lines <- sc.Text():
		default:
		}
	}
	return l.b.Write(p)
}

func (l *procOutput) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *procOutput) tail(n int) string {
	lines := strings.Split(strings.TrimSpace(l.String()), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
