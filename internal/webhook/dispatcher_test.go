package webhook_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/webhook"
)

// localHooks lets the dispatcher reach httptest servers (127.0.0.1, http).
var localHooks = config.Webhooks{AllowPrivate: true, AllowHTTP: true, Timeout: 5 * time.Second}

// TestReceiverDownFiveMinutes: a receiver that answers 503 for five
// minutes (on a faked clock) gets every delivery once it is back, each
// within 5 attempts: with the schedule 5s, 30s, 2m, 5m (±10%), attempt 4
// comes by 2m51s and attempt 5 between 6m50s and 8m21s, after the outage.
func TestReceiverDownFiveMinutes(t *testing.T) {
	t.Parallel()
	start := time.Now().Truncate(time.Microsecond)
	clock := &fakeClock{now: start}
	backAt := start.Add(5 * time.Minute)
	rc := newReceiver(t, testSecret, clock.Now, func(*http.Request) int {
		if clock.Now().Before(backAt) {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	})
	pool := testPool(t)
	const n = 20
	ids := make(map[int64]string, n)
	payloads := make(map[string]string, n)
	for i := range n {
		payload := fmt.Sprintf(`{"type":"job.succeeded","data":{"id":"j%d"}}`, i)
		id, eventID := insertDelivery(t, pool, "acme", fmt.Sprintf("j%d", i), rc.srv.URL+"/hook", []byte(payload), start.Add(time.Millisecond))
		ids[id], payloads[eventID] = eventID, payload
	}
	r := startDispatcher(t, pool, webhook.Params{Webhooks: localHooks, Now: clock.Now})

	steps := drive(t, r, clock, 200)

	hits, good, bad := rc.snapshot()
	assert.Zero(t, bad, "every request verified")
	require.Len(t, good, n, "every delivery arrived after the receiver came back")
	maxAttempts := 0
	for id, eventID := range ids {
		row := readDelivery(t, pool, id)
		assert.Equal(t, "delivered", row.Status)
		require.NotNil(t, row.Delivered)
		assert.False(t, row.Delivered.Before(backAt), "delivered after the outage")
		assert.LessOrEqual(t, row.Delivered.Sub(start), 8*time.Minute+21*time.Second)
		assert.Equal(t, hits[eventID], row.Attempts, "one request per recorded attempt")
		assert.Equal(t, payloads[eventID], string(good[eventID]), "the payload as stored")
		maxAttempts = max(maxAttempts, row.Attempts)
	}
	assert.Equal(t, 5, maxAttempts, "bound on attempts for a 5 minute outage")
	t.Logf("%d deliveries, %d clock steps, at most %d attempts each", n, steps, maxAttempts)
}

// TestDeadAfterRetryWindow: a receiver that never accepts leaves the
// delivery dead, with its last error, after 13 attempts over 25h.
func TestDeadAfterRetryWindow(t *testing.T) {
	t.Parallel()
	start := time.Now().Truncate(time.Microsecond)
	clock := &fakeClock{now: start}
	rc := newReceiver(t, testSecret, clock.Now, func(*http.Request) int { return http.StatusInternalServerError })
	pool := testPool(t)
	id, eventID := insertDelivery(t, pool, "acme", "j1", rc.srv.URL+"/hook", []byte(`{}`), start.Add(time.Millisecond))
	r := startDispatcher(t, pool, webhook.Params{Webhooks: localHooks, Now: clock.Now, Rand: func() float64 { return 0.5 }})

	drive(t, r, clock, 50)

	row := readDelivery(t, pool, id)
	assert.Equal(t, "dead", row.Status)
	assert.Equal(t, 13, row.Attempts)
	require.NotNil(t, row.LastError)
	assert.Equal(t, "HTTP 500", *row.LastError)
	require.NotNil(t, row.LastStatus)
	assert.EqualValues(t, 500, *row.LastStatus)
	hits, _, _ := rc.snapshot()
	assert.Equal(t, 13, hits[eventID])
	assert.GreaterOrEqual(t, clock.Now().Sub(start), 24*time.Hour, "retried for at least 24h")
}

// TestRebindingHostIsNotCalled: a name that resolves to 127.0.0.1 at
// delivery time is refused at connect, whatever it resolved to before; the
// receiver is never called. With allow_private the same delivery goes
// through, so the refusal is the address rule's doing.
func TestRebindingHostIsNotCalled(t *testing.T) {
	t.Parallel()
	for _, allowPrivate := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow_private=%v", allowPrivate), func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, testSecret, time.Now, func(*http.Request) int { return http.StatusOK })
			port := rc.srv.Listener.Addr().(interface{ String() string }).String()
			_, port, _ = cutLast(port, ":")
			lookup := func(_ context.Context, host string) ([]netipAddr, error) {
				if host != "hooks.rebind.example" {
					return nil, fmt.Errorf("unexpected lookup of %q", host)
				}
				return []netipAddr{mustAddr("127.0.0.1")}, nil
			}
			cfg := localHooks
			cfg.AllowPrivate = allowPrivate
			httpClient := webhook.NewClient(webhook.ClientConfig{AllowPrivate: allowPrivate, Timeout: 5 * time.Second, LookupIP: lookup})
			pool := testPool(t)
			id, eventID := insertDelivery(t, pool, "acme", "j1", "http://hooks.rebind.example:"+port+"/hook", []byte(`{}`), time.Now())
			r := startDispatcher(t, pool, webhook.Params{Webhooks: cfg, Client: httpClient})
			a := r.next(t)
			hits, _, _ := rc.snapshot()
			row := readDelivery(t, pool, id)
			if allowPrivate {
				assert.Equal(t, webhook.OutcomeDelivered, a.Outcome)
				assert.Equal(t, 1, hits[eventID])
				return
			}
			assert.Equal(t, webhook.OutcomeRetry, a.Outcome)
			assert.Zero(t, hits[eventID], "the receiver was not called")
			assert.Equal(t, "pending", row.Status)
			require.NotNil(t, row.LastError)
			assert.Contains(t, *row.LastError, "refused to connect to 127.0.0.1")
			assert.NotContains(t, *row.LastError, "/hook", "the URL stays out of last_error")
		})
	}
}

// TestLocalhostIsNotCalled: the system resolver's answer is judged too.
func TestLocalhostIsNotCalled(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, testSecret, time.Now, func(*http.Request) int { return http.StatusOK })
	_, port, _ := cutLast(rc.srv.Listener.Addr().String(), ":")
	cfg := localHooks
	cfg.AllowPrivate = false
	pool := testPool(t)
	id, _ := insertDelivery(t, pool, "acme", "j1", "http://localhost:"+port+"/hook", []byte(`{}`), time.Now())
	r := startDispatcher(t, pool, webhook.Params{Webhooks: cfg})
	a := r.next(t)
	assert.Equal(t, webhook.OutcomeRetry, a.Outcome)
	assert.Contains(t, a.Error, "not public")
	hits, _, _ := rc.snapshot()
	assert.Empty(t, hits)
	assert.Equal(t, 1, readDelivery(t, pool, id).Attempts)
}

// TestAttemptFailures: what counts as a failure and what last_error keeps.
func TestAttemptFailures(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	other := newReceiver(t, testSecret, time.Now, func(*http.Request) int { return http.StatusOK })
	mux := http.NewServeMux()
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.srv.URL+"/hook", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		// The server notices the client leaving only once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		line := []byte("no \x00such\x1b[31m thing ")
		for range 1 << 16 { // about 1.3 MiB, over the 64 KiB cap
			if _, err := w.Write(line); err != nil {
				return
			}
		}
	})
	srv := newTestServer(t, mux)
	pool := testPool(t)
	cfg := localHooks
	cfg.Timeout = 300 * time.Millisecond
	for _, path := range []string{"/redirect", "/slow", "/big"} {
		insertDelivery(t, pool, "acme", "j"+path[1:], srv.URL+path, []byte(`{}`), time.Now())
	}
	insertDelivery(t, pool, "nosecret", "j-nosecret", other.srv.URL+"/hook", []byte(`{}`), time.Now())
	r := startDispatcher(t, pool, webhook.Params{Webhooks: cfg})
	got := map[string]webhook.Attempt{}
	for range 4 {
		a := r.next(t)
		got[a.JobID] = a
	}
	assert.Equal(t, "HTTP 307: redirects are not followed", got["jredirect"].Error)
	assert.Equal(t, 307, got["jredirect"].Status)
	assert.Equal(t, "no answer within 300ms", got["jslow"].Error)
	assert.Equal(t, 400, got["jbig"].Status)
	big := got["jbig"].Error
	assert.True(t, strings.HasPrefix(big, "HTTP 400: no such [31m thing no such"), big)
	assert.LessOrEqual(t, len(big), len("HTTP 400: ")+128, "a short, sanitized part of the answer")
	assert.Equal(t, "no webhook secret is configured for the tenant", got["j-nosecret"].Error)
	for _, a := range got {
		assert.Equal(t, webhook.OutcomeRetry, a.Outcome, a.JobID)
	}
	hits, _, _ := other.snapshot()
	assert.Empty(t, hits, "neither the redirect's target nor an unsigned delivery was called")
}
