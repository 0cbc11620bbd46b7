package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// EnvChromium names the Chromium (or Chrome) binary the console tests
// drive; unset, they look for chromium on PATH.
const EnvChromium = "LLMQ_CHROMIUM"

// EnvArtifacts is the directory the browser tests write their screenshots
// to; unset, a temporary directory the test logs.
const EnvArtifacts = "LLMQ_TEST_ARTIFACTS"

// EnvDocsScreenshots, set to 1, also writes docs/console-overview.png and
// docs/console-job.png (the README's screenshots).
const EnvDocsScreenshots = "LLMQ_UPDATE_DOCS_SCREENSHOTS"

// chromiumPath finds the browser or fails the test saying how to get one.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(EnvChromium); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("the console's browser tests need Chromium: install it (apt-get install -y chromium) or set %s to a Chromium or Chrome binary", EnvChromium)
	return ""
}

// browser is one headless Chromium with a fresh profile.
type browser struct {
	t         *testing.T
	ctx       context.Context
	artifacts string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 800),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Do(ctx), "start %s", chromiumPath(t))
	dir := os.Getenv(EnvArtifacts)
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	t.Logf("console screenshots go to %s", dir)
	return &browser{t: t, ctx: ctx, artifacts: dir}
}

// do runs steps with a deadline of a minute.
func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	require.NoError(b.t, chromedp.Do(ctx, steps...))
}

// evalString returns a JavaScript expression's value as a string.
func (b *browser) evalString(expr string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string]("String("+expr+")"))
	require.NoError(b.t, err, "evaluate %s", expr)
	return v
}

// waitTrue waits until the JavaScript expression is true, re-evaluating it
// every 100 ms, and fails naming what after timeout.
func (b *browser) waitTrue(what, expr string, timeout time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("Boolean("+expr+")"))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.shot("timeout-" + strings.ReplaceAll(what, " ", "-"))
			body, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
			b.t.Fatalf("waited %s for %s; the page says:\n%s", timeout, what, body)
		}
		<-tick.C
	}
}

// shot saves the viewport as <artifacts>/<name>.png and returns the path.
func (b *browser) shot(name string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return ""
	}
	p := filepath.Join(b.artifacts, name+".png")
	require.NoError(b.t, os.WriteFile(p, png, 0o644))
	return p
}

// docsShot copies a screenshot to docs/ when EnvDocsScreenshots is set.
func docsShot(t *testing.T, src, name string) {
	t.Helper()
	if os.Getenv(EnvDocsScreenshots) != "1" || src == "" {
		return
	}
	data, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join("..", "docs", name), data, 0o644))
}

// js quotes s as a JavaScript string.
func js(s string) string { return fmt.Sprintf("%q", s) }

func strconvID(id int64) string { return fmt.Sprint(id) }
