package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/testsvc"
)

// Promise: each example under examples/ works as its README says. With
// `llmq up` running on RabbitMQ and llmsim, the example's one command
// sends its jobs, prints every result, each an answer that fits the JSON
// Schema it asked for, and exits 0.
func TestExamples(t *testing.T) {
	amqpURL := testVhost(t, testsvc.AMQPURL(t))
	up := startProc(t, buildCmd(t, "llmq"), append(os.Environ(),
		"LLMQ_POSTGRES_URL="+testsvc.PostgresURL(t),
		"LLMQ_BROKER=rabbitmq",
		"LLMQ_AMQP_URL="+amqpURL,
		"LLMQ_HTTP_ADDR=127.0.0.1:0",
		"LLMQ_METRICS_ADDR=127.0.0.1:0",
	), "up")
	up.waitFor(t, regexp.MustCompile(`(Ctrl-C stops everything\.)`))

	const n = 8 // more than each example's samples, so they repeat too
	t.Run("ticket-triage", func(t *testing.T) {
		readme := readRepoFile(t, "examples/ticket-triage/README.md")
		require.Contains(t, readme, "go run ./examples/ticket-triage", "the README's command changed: update this test")
		bin := filepath.Join(t.TempDir(), "ticket-triage")
		goCmd := exec.Command("go", "build", "-o", bin, "./examples/ticket-triage")
		goCmd.Dir = repoRoot()
		built, err := goCmd.CombinedOutput()
		require.NoError(t, err, "go build ./examples/ticket-triage: %s", built)

		out := runExample(t, exec.Command(bin, "-amqp", amqpURL, "-n", strconv.Itoa(n), "-timeout", "90s"), up)
		line := regexp.MustCompile(`(?m)^(ticket-\d+) job=\S+ category=(billing|bug|account|feature_request|other) urgency=(low|medium|high) summary="([^"]{1,200})"$`)
		requireEach(t, out, line, n)
		require.Contains(t, out, "all "+strconv.Itoa(n)+" tickets triaged")
	})

	t.Run("moderation", func(t *testing.T) {
		readme := readRepoFile(t, "examples/moderation/README.md")
		require.Contains(t, readme, "npm ci && npm start", "the README's command changed: update this test")
		dir := nodeProject(t, filepath.Join(repoRoot(), "examples", "moderation"), "moderate.js")

		cmd := exec.Command("npm", "start", "--", "--amqp", amqpURL, "--n", strconv.Itoa(n), "--timeout", "90")
		cmd.Dir = dir
		out := runExample(t, cmd, up)
		line := regexp.MustCompile(`(?m)^(mod-\S+) label=(ok|spam|abuse|adult|off_topic) confidence=(\S+) reason="([^"]{1,200})"$`)
		for _, m := range requireEach(t, out, line, n) {
			c, err := strconv.ParseFloat(m[3], 64)
			require.NoError(t, err, m[0])
			require.True(t, c >= 0 && c <= 1, "confidence outside [0, 1]: %s", m[0])
		}
		require.Contains(t, out, "all "+strconv.Itoa(n)+" posts labelled")
	})
}

// runExample runs cmd (in a process group of its own, so npm's child goes
// too) to its end within three minutes and returns its output, failing the
// test with the output and llmq's log tail when it does not exit 0.
func runExample(t *testing.T, cmd *exec.Cmd, up *proc) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	stop := context.AfterFunc(ctx, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	defer stop()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%s: %v\n%s\nllmq up:\n%s", strings.Join(cmd.Args, " "), err, out.String(), up.out.tail(30))
	}
	return out.String()
}

// requireEach checks that re matches n lines of out with n different first
// submatches (one line per job) and returns the matches.
func requireEach(t *testing.T, out string, re *regexp.Regexp, n int) [][]string {
	t.Helper()
	matches := re.FindAllStringSubmatch(out, -1)
	keys := map[string]bool{}
	for _, m := range matches {
		keys[m[1]] = true
	}
	require.Len(t, keys, n, "want one result line per job matching %s, got:\n%s", re, out)
	require.Len(t, matches, n, "a job's result was printed twice:\n%s", out)
	return matches
}

// nodeProject copies a Node example (its package.json, package-lock.json
// and files) to a temporary directory and installs its locked dependencies
// there, leaving the work tree as it is. Node.js 20+ and npm are required:
// without them the test fails saying what to install.
func nodeProject(t *testing.T, src string, files ...string) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the Node examples need Node.js 20 or later and npm: %s is not on PATH (install them, e.g. apt-get install nodejs npm)", tool)
		}
	}
	v, err := exec.Command("node", "--version").Output()
	require.NoError(t, err)
	major, _ := strconv.Atoi(strings.TrimPrefix(strings.SplitN(strings.TrimSpace(string(v)), ".", 2)[0], "v"))
	if major < 20 {
		t.Fatalf("the Node examples need Node.js 20 or later; node --version says %s", v)
	}
	dir := t.TempDir()
	for _, f := range append([]string{"package.json", "package-lock.json"}, files...) {
		data, err := os.ReadFile(filepath.Join(src, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), data, 0o644))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	npm := exec.CommandContext(ctx, "npm", "ci", "--prefer-offline", "--no-audit", "--no-fund")
	npm.Dir = dir
	out, err := npm.CombinedOutput()
	require.NoError(t, err, "npm ci in a copy of %s: %s", src, out)
	return dir
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}
