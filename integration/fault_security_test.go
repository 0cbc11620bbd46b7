package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/sim"
)

// TestFaultSecurity promises that the producer API and the consumer hold
// up against hostile clients and a hostile provider: no API key or a wrong
// one is 401; another tenant's job is 404; hostile job IDs (SQL-ish, path
// traversal, overlong, unicode, control characters) are refused with 400
// naming `id` on submit and never reach a 5xx on lookup; oversize bodies
// are 413; and the provider API key — here one without the usual "sk-"
// shape, so only the exact-key scrubbing protects it — never appears in
// either process's logs, in any column of the jobs and dead_letters
// tables, in the broker's DLQ envelopes or in an API body, although the
// provider echoes the Authorization header in its error bodies, codes and
// headers.
func TestFaultSecurity(t *testing.T) {
	const key = "LLMQ-hostile-key-7f3a9b"
	var echoed atomic.Int64
	s := newFaultStack(t, faultOptions{
		ProviderKey: key,
		Sim:         sim.Config{Latency: sim.LatencyConfig{TTFT: sim.Duration(5 * time.Millisecond)}},
		Wrap: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := readAllLimited(r)
				auth := r.Header.Get("Authorization")
				status := 0
				switch b := string(body); {
				case strings.Contains(b, "[job:echo400-"):
					status = http.StatusBadRequest
				case strings.Contains(b, "[job:echo500-"):
					status = http.StatusInternalServerError
				case strings.Contains(b, "[job:echopad-"):
					// The key placed across the truncation points of
					// provider messages (300 bytes) and codes (128 bytes).
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusBadRequest)
					bare := strings.TrimPrefix(auth, "Bearer ")
					fmt.Fprintf(w, `{"error":{"message":%q,"code":%q}}`, strings.Repeat("m", 295)+bare, strings.Repeat("c", 120)+bare)
					echoed.Add(1)
					return
				}
				if status == 0 {
					next.ServeHTTP(w, r)
					return
				}
				if strings.Contains(auth, key) {
					echoed.Add(1)
				}
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("X-Debug-Authorization", auth)
				w.WriteHeader(status)
				msg, _ := json.Marshal("you sent Authorization: " + auth + " and key " + strings.TrimPrefix(auth, "Bearer "))
				code, _ := json.Marshal(strings.TrimPrefix(auth, "Bearer "))
				fmt.Fprintf(w, `{"error":{"message":%s,"type":%s,"code":%s,"param":%s}}`, msg, code, code, msg)
			})
		},
		YAML: "limits:\n  max_payload_bytes: 8192\n",
	})
	producer, base := s.producer()
	consumer := s.consumer("sec-1")

	var bodies []string // every API body, grepped for the key at the end
	call := func(method, path, apiKey string, body []byte) (int, []byte) {
		t.Helper()
		code, data := apiCall(t, base, method, path, apiKey, body)
		bodies = append(bodies, string(data))
		require.Less(t, code, 500, "%s %s: %s", method, path, data)
		return code, data
	}

	// Submit: good jobs and jobs the hostile provider answers with echoes.
	want := map[string]string{}
	submit := func(id, extra, status string) {
		code, body := call("POST", "/v1/jobs", "key-acme-sec-0123456789", faultJob(id, extra))
		require.Equal(t, http.StatusAccepted, code, "%s", body)
		want[id] = status
	}
	for i := range 20 {
		submit(fmt.Sprintf("sec-%03d", i), "", "succeeded")
	}
	submit("echopad-0", "", "failed")
	for i := range 2 {
		submit(fmt.Sprintf("echo400-%d", i), "", "failed")
		submit(fmt.Sprintf("echo500-%d", i), `,"max_attempts":2`, "dead")
	}

	// Authentication and tenancy.
	code, _ := call("GET", "/v1/jobs/sec-000", "", nil)
	require.Equal(t, http.StatusUnauthorized, code, "no key")
	code, _ = call("GET", "/v1/jobs/sec-000", "key-nobody", nil)
	require.Equal(t, http.StatusUnauthorized, code, "unknown key")
	code, _ = call("POST", "/v1/jobs", "", faultJob("sec-nokey", ""))
	require.Equal(t, http.StatusUnauthorized, code, "no key on submit")
	code, _ = call("GET", "/v1/jobs/sec-000", "key-globex-sec-0123456789", nil)
	require.Equal(t, http.StatusNotFound, code, "another tenant's job looks missing")
	code, _ = call("POST", "/v1/jobs/sec-000/cancel", "key-globex-sec-0123456789", nil)
	require.Equal(t, http.StatusNotFound, code, "another tenant cannot cancel")

	// Hostile IDs: 400 naming id on submit; never a 5xx on lookup. ("." and
	// ".." are valid under the contract's ID rule; see the report.)
	hostile := []string{
		"x'; DROP TABLE jobs;--", "1 OR 1=1", "../../etc/passwd", "a/b", "a b", strings.Repeat("a", 129),
		"ünïcødé", "emoji-😀", "nul\x00byte", "line\nbreak", "%2e%2e%2f", "<script>alert(1)</script>",
	}
	for _, id := range hostile {
		body := fmt.Sprintf(`{"id":%s,"model":"qwen-plus","request":{"messages":[{"role":"user","content":"x"}]}}`, jsonString(id))
		code, data := call("POST", "/v1/jobs", "key-acme-sec-0123456789", []byte(body))
		require.Equal(t, http.StatusBadRequest, code, "submit id %q: %s", id, data)
		var e struct {
			Error struct{ Field string }
		}
		require.NoError(t, json.Unmarshal(data, &e), "%s", data)
		require.Equal(t, "id", e.Error.Field, "submit id %q: %s", id, data)

		code, data = call("GET", "/v1/jobs/"+url.PathEscape(id), "key-acme-sec-0123456789", nil)
		require.Contains(t, []int{http.StatusBadRequest, http.StatusNotFound, http.StatusMovedPermanently}, code, "GET id %q: %s", id, data)
	}
	code, _ = call("GET", "/v1/jobs/../../etc/passwd", "key-acme-sec-0123456789", nil)
	require.NotEqual(t, http.StatusOK, code)

	// Body limits.
	big := faultJob("sec-big", `,"metadata":{"pad":"`+strings.Repeat("x", 9000)+`"}`)
	code, data := call("POST", "/v1/jobs", "key-acme-sec-0123456789", big)
	require.Equal(t, http.StatusRequestEntityTooLarge, code, "%s", data)
	code, data = call("POST", "/v1/jobs:batch", "key-acme-sec-0123456789", []byte("["+strings.Repeat(string(big)+",", 20)+string(big)+"]"))
	require.Equal(t, http.StatusRequestEntityTooLarge, code, "%s", data)

	s.waitTerminal(len(want), consumer, producer)
	for id := range want {
		code, _ := call("GET", "/v1/jobs/"+id, "key-acme-sec-0123456789", nil)
		require.Equal(t, http.StatusOK, code)
	}
	code, dlqListing := call("GET", "/v1/dlq", "key-acme-sec-0123456789", nil)
	require.Equal(t, http.StatusOK, code)
	s.stopAll(consumer, producer)

	l := s.settle("security: hostile clients and a key-echoing provider", want, "401/404/400/413 as specified; key found nowhere")
	require.Zero(t, l.Lost)
	require.Zero(t, l.DuplicateResults)
	require.Positive(t, echoed.Load(), "the hostile provider must have had the key to echo")

	// Grep every place the key could land.
	ctx := context.Background()
	var tables string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT coalesce((SELECT string_agg(j::text, E'\n') FROM jobs j), '') || E'\n' ||
		coalesce((SELECT string_agg(d::text || convert_from(d.body, 'UTF8'), E'\n') FROM dead_letters d), '')`).Scan(&tables))
	require.Contains(t, tables, "[redacted]", "the echoed key was scrubbed, not absent")
	// Dead letters live in Postgres (above) and are served by GET /v1/dlq;
	// the broker's dead-letter queue is drained into the same table.
	for where, text := range map[string]string{
		"producer log": producer.out.String(), "consumer log": consumer.out.String(),
		"jobs and dead_letters tables": tables, "DLQ listing": string(dlqListing), "API bodies": strings.Join(bodies, "\n"),
	} {
		require.NotContains(t, text, key, "the provider key leaked into the %s", where)
		// A cut through an echoed key must not leave its prefix behind either.
		if n := leakedPrefix(text, key); n >= 6 {
			t.Errorf("partial leak: a %d-byte prefix of the provider key (%q…) is in the %s", n, key[:n], where)
		}
		for _, apiKey := range []string{"key-acme-sec-0123456789", "key-globex-sec-0123456789"} {
			if where != "API bodies" {
				require.NotContains(t, text, apiKey, "an API key leaked into the %s", where)
			}
		}
	}
	t.Logf("the provider echoed the key %d times; the DLQ listing, %d API bodies and both logs are clean", echoed.Load(), len(bodies))
}

// leakedPrefix is the length of the longest prefix of key found in text.
func leakedPrefix(text, key string) int {
	n := 0
	for n < len(key) && strings.Contains(text, key[:n+1]) {
		n++
	}
	return n
}
