package integration

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
)

// TestConsoleInBrowser drives the web console (/ui/) in headless Chromium
// against a producer and two consumer replicas on real Postgres and
// RabbitMQ: log in with a tenant key, cancel a queued job, watch a job
// submitted through the API reach succeeded without a reload, open its
// detail, replay a dead letter, find another tenant's job neither listed
// nor reachable by URL, and, with an admin key, watch the overview under
// load with both replicas and their quota shares. Screenshots go to
// LLMQ_TEST_ARTIFACTS (or a temporary directory the test logs).
func TestConsoleInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("a browser and a minute of real load: not in -short")
	}
	stack := newConsoleStack(t)
	b := newBrowser(t)
	t.Cleanup(func() {
		if t.Failed() {
			for _, id := range []string{"live-1", "doomed"} {
				var doc map[string]any
				stack.call(http.MethodGet, "/v1/jobs/"+id, consoleAcmeKey, nil, &doc)
				t.Logf("job %s: %v", id, doc)
			}
		}
	})

	// A job queued while no consumer runs yet stays queued: cancel it.
	stack.submit(consoleAcmeKey, "cancel-me", consoleSlow, nil)
	b.login(stack.baseURL, consoleAcmeKey)
	b.waitTrue("the tenant named", `document.getElementById('who').textContent.includes('acme')`, 10*time.Second)
	b.goHash("#/jobs/cancel-me")
	b.waitTrue("the queued job", statusIs("queued"), 15*time.Second)
	b.do(chromedp.Click(chromedp.ID("job-cancel")))
	b.waitTrue("the confirmation", `document.getElementById('confirm').open`, 5*time.Second)
	b.shot("cancel-confirm")
	b.do(chromedp.Click(chromedp.ID("confirm-ok")))
	b.waitTrue("the job cancelled", statusIs("cancelled"), 15*time.Second)
	var doc api.JobView
	require.Equal(t, http.StatusOK, stack.call(http.MethodGet, "/v1/jobs/cancel-me", consoleAcmeKey, nil, &doc))
	assert.EqualValues(t, "cancelled", doc.Status)

	stack.startConsumers()
	// The overview's load (another tenant's, so that acme's list stays short) runs while the rest of the test does.
	stack.submitLoad(consoleGlobexKey, consoleFast, 600)

	// A job submitted through the API reaches succeeded on the open jobs
	// page, without a reload (the marker set on the window survives).
	b.goHash("#/jobs")
	b.waitTrue("the jobs list", `document.querySelector('#jobs-list table, #jobs-list p')`, 15*time.Second)
	b.evalString(`window.__consoleMarker = 'still-here'`)
	stack.submit(consoleAcmeKey, "live-1", consoleSlow, map[string]any{"priority": "high"})
	b.waitTrue("live-1 listed unfinished", `['queued','running'].includes(rowStatus('live-1'))`, 30*time.Second)
	b.shot("jobs-live-running")
	b.waitTrue("live-1 succeeded", `rowStatus('live-1') === 'succeeded'`, 90*time.Second)
	assert.Equal(t, "still-here", b.evalString(`window.__consoleMarker`), "the page was not reloaded")
	assert.Equal(t, "true", b.evalString(`[...document.querySelectorAll('input, select')].every((e) => e.labels && e.labels.length > 0)`),
		"every form control has a label")
	b.shot("jobs")

	// Its detail: response, usage, and the request as submitted.
	b.do(chromedp.Click(chromedp.CSS(`a[data-job="live-1"]`)))
	b.waitTrue("the job's detail", statusIs("succeeded"), 15*time.Second)
	b.waitTrue("the request shown", `document.body.innerText.includes('Hello from live-1')`, 10*time.Second)
	assert.Contains(t, b.evalString(`document.body.innerText`), "completion")
	docsShot(t, b.shot("job-detail"), "console-job.png")

	// A dead letter: a job whose deadline passes during its call.
	stack.submit(consoleAcmeKey, "doomed", consoleSlow, map[string]any{"priority": "high", "max_attempts": 1,
		"deadline": time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano)})
	dlID := stack.waitDeadLetter(consoleAcmeKey, "doomed", 90*time.Second)
	b.goHash("#/dlq")
	b.waitTrue("the dead letter listed", `document.querySelector('[data-dlq="`+dlID+`"]')`, 15*time.Second)
	b.do(chromedp.Click(chromedp.CSS(`[data-dlq="` + dlID + `"] button.dlq-replay`)))
	b.waitTrue("the confirmation", `document.getElementById('confirm').open`, 5*time.Second)
	b.do(chromedp.Click(chromedp.ID("confirm-ok")))
	b.waitTrue("the replay done", `document.getElementById('dlq-note').textContent.includes('Replayed dead letter `+dlID+`')`, 15*time.Second)
	b.shot("dlq-replayed")
	assert.NotContains(t, stack.deadLetterIDs(consoleAcmeKey), dlID, "the replayed dead letter left the queue")

	// Another tenant's job: not listed, not reachable by URL.
	stack.submit(consoleGlobexKey, "globex-secret", consoleSlow, map[string]any{"priority": "high"})
	b.goHash("#/jobs")
	b.waitTrue("the jobs list", `document.querySelector('#jobs-list table')`, 15*time.Second)
	assert.Equal(t, "false", b.evalString(`Boolean(document.querySelector('[data-job="globex-secret"]'))`))
	for _, hash := range []string{"#/jobs/globex-secret", "#/jobs/globex-secret?tenant=globex"} {
		b.goHash(hash)
		b.waitTrue("no such job at "+hash, `document.getElementById('job-missing')`, 15*time.Second)
		assert.NotContains(t, b.evalString(`document.body.innerText`), "Hello from globex-secret")
	}
	assert.Equal(t, http.StatusNotFound, stack.call(http.MethodGet, "/v1/jobs/globex-secret", consoleAcmeKey, nil, nil))

	// The overview, as an admin, under load: both replicas with their
	// shares, a series of admitted requests, live over server-sent events.
	b.do(chromedp.Click(chromedp.ID("logout")))
	b.login(stack.baseURL, consoleAdminKey)
	b.waitTrue("the admin named", `document.getElementById('who').textContent.includes('admin')`, 10*time.Second)
	b.goHash("#/overview")
	fast := `document.querySelector('[data-model="` + consoleFast + `"]')`
	b.waitTrue("both replicas of "+consoleFast, fast+` && `+fast+`.querySelectorAll('tbody tr').length === 2`, 30*time.Second)
	b.waitTrue("half a minute of series", fast+`.querySelector('polyline.req') && `+fast+`.querySelector('polyline.req').points.length >= 30`, 90*time.Second)
	assert.True(t, strings.HasPrefix(b.evalString(`document.getElementById('ov-live').textContent`), "Live"))
	shares := b.evalString(`[...` + fast + `.querySelectorAll('tbody tr td:nth-child(3)')].map((td) => td.textContent).join(',')`)
	assert.Len(t, slices.DeleteFunc(strings.Split(shares, ","), func(s string) bool { return !strings.HasSuffix(s, "%") }), 2,
		"each replica shows its quota share: %s", shares)
	docsShot(t, b.shot("overview"), "console-overview.png")

	// A phone's width: one column, nothing wider than the screen.
	b.do(chromedp.EmulateViewport(390, 844))
	b.waitTrue("the page within the phone's width", `document.documentElement.scrollWidth <= window.innerWidth + 1`, 10*time.Second)
	b.shot("overview-phone")
	b.goHash("#/jobs?tenant=globex") // an admin names the tenant it reads
	b.waitTrue("globex's jobs listed", `document.querySelector('[data-job^="load-"]')`, 15*time.Second)
	b.waitTrue("the jobs within the phone's width", `document.documentElement.scrollWidth <= window.innerWidth + 1`, 10*time.Second)
	b.shot("jobs-phone")
}

// statusIs is the expression: the job detail shows status.
func statusIs(status string) string {
	return `document.getElementById('job-status') && document.getElementById('job-status').textContent === ` + js(status)
}

// login opens the console and logs in with key.
func (b *browser) login(baseURL, key string) {
	b.t.Helper()
	b.do(chromedp.Navigate(baseURL + "/ui/"))
	b.waitTrue("the login form", `document.getElementById('login') && !document.getElementById('login').hidden`, 15*time.Second)
	b.do(chromedp.SendKeys(chromedp.ID("login-key"), key), chromedp.Click(chromedp.CSS(`#login-form button`)))
	b.waitTrue("logged in", `document.getElementById('login').hidden`, 15*time.Second)
	// rowStatus reads a job's status off the jobs list.
	b.evalString(`window.rowStatus = (id) => { const e = document.querySelector('[data-status-of="' + id + '"]'); return e ? e.textContent : '' }`)
}

// goHash moves the console to a page without reloading it.
func (b *browser) goHash(hash string) {
	b.t.Helper()
	b.evalString(`location.hash = ` + js(hash))
}

// waitDeadLetter waits until the tenant's dead-letter queue holds the
// job's dead letter and returns its id.
func (s *consoleStack) waitDeadLetter(key, jobID string, timeout time.Duration) string {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		var resp api.DLQResponse
		require.Equal(s.t, http.StatusOK, s.call(http.MethodGet, "/v1/dlq", key, nil, &resp))
		for _, dl := range resp.DeadLetters {
			if dl.JobID == jobID {
				return strconvID(dl.ID)
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("no dead letter of job %s within %s", jobID, timeout)
		}
		<-tick.C
	}
}

// deadLetterIDs lists the ids of the tenant's dead letters.
func (s *consoleStack) deadLetterIDs(key string) []string {
	s.t.Helper()
	var resp api.DLQResponse
	require.Equal(s.t, http.StatusOK, s.call(http.MethodGet, "/v1/dlq", key, nil, &resp))
	var ids []string
	for _, dl := range resp.DeadLetters {
		ids = append(ids, strconvID(dl.ID))
	}
	return ids
}
