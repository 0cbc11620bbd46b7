package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/testsvc"
)

// Promise: README's quickstart works as written. `llmq up` starts, prints a
// curl to submit and one to poll; running exactly those commands submits a
// job that reaches `succeeded` with the simulator's reply; Ctrl-C (SIGINT)
// stops everything cleanly.
func TestQuickstartFromREADME(t *testing.T) {
	readme := readRepoFile(t, "README.md")
	for _, want := range []string{"go run ./cmd/llmq up", "make test"} {
		if !strings.Contains(readme, want) {
			t.Fatalf("README quickstart no longer says %q; update this test with it", want)
		}
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the quickstart uses curl: install it (apt-get install curl)")
	}
	bin := buildCmd(t, "llmq")
	cmd := exec.Command(bin, "up")
	// Port 0 everywhere: the banner prints the addresses really bound, so the
	// printed curl commands are what a user would copy.
	cmd.Env = append(os.Environ(),
		"LLMQ_POSTGRES_URL="+testsvc.PostgresURL(t),
		"LLMQ_HTTP_ADDR=127.0.0.1:0",
		"LLMQ_METRICS_ADDR=127.0.0.1:0",
	)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})

	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	banner := readUntil(t, lines, "Ctrl-C stops everything.", 2*time.Minute, &stderr)

	submit, poll := bannerCurls(t, banner)
	out := sh(t, submit)
	var accepted struct{ ID, Status string }
	if err := json.Unmarshal([]byte(out), &accepted); err != nil || accepted.ID != "hello-1" {
		t.Fatalf("submit answered %q (%v)", out, err)
	}

	deadline := time.Now().Add(60 * time.Second)
	var got struct {
		Status   string          `json:"status"`
		Response json.RawMessage `json:"response"`
	}
	for {
		body := sh(t, poll)
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("poll answered %q: %v", body, err)
		}
		if got.Status == "succeeded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job still %q after 60s; stderr:\n%s", got.Status, stderr.String())
		}
		time.Sleep(200 * time.Millisecond) // polling the API as the README tells a user to
	}
	if !strings.Contains(string(got.Response), "llmsim reply") {
		t.Fatalf("response is not the simulator's reply: %s", got.Response)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("llmq up exited with %v after SIGINT; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("llmq up did not stop within 60s of SIGINT")
	}
	if !strings.Contains(strings.Join(drain(lines), "\n"), "llmq up: stopped") {
		t.Fatal("llmq up did not say it stopped")
	}
}

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(file)), name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func readUntil(t *testing.T, lines <-chan string, marker string, timeout time.Duration, stderr fmt.Stringer) string {
	t.Helper()
	var b strings.Builder
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("llmq up ended before printing %q; stdout:\n%s\nstderr:\n%s", marker, b.String(), stderr.String())
			}
			b.WriteString(l + "\n")
			if strings.Contains(l, marker) {
				return b.String()
			}
		case <-timer.C:
			t.Fatalf("no %q within %s; stdout:\n%s\nstderr:\n%s", marker, timeout, b.String(), stderr.String())
		}
	}
}

func drain(lines <-chan string) []string {
	var out []string
	for l := range lines {
		out = append(out, l)
	}
	return out
}

var curlLine = regexp.MustCompile(`(?m)^\s+(curl (?:[^\n]*\\\n)*[^\n]*)$`)

// bannerCurls returns the submit and poll commands exactly as printed.
func bannerCurls(t *testing.T, banner string) (string, string) {
	t.Helper()
	m := curlLine.FindAllStringSubmatch(banner, -1)
	if len(m) != 2 {
		t.Fatalf("want 2 curl commands in the banner, got %d:\n%s", len(m), banner)
	}
	return m[0][1], m[1][1]
}

func sh(t *testing.T, command string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "sh", "-c", command).Output()
	if err != nil {
		t.Fatalf("%s: %v", command, err)
	}
	return string(out)
}
