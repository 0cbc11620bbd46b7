package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/sim"
)

// TestFaultPoison promises that hostile or broken messages mixed into a
// lane are never dropped and never stall good work: malformed JSON, wrong
// types, unknown fields, a non-object, an unknown model, an oversize
// payload, invalid UTF-8, an absurd max_tokens and a hostile ID are each
// dead-lettered with a reason that names the problem — a dead_letters row
// AND an envelope on the broker's DLQ, both carrying the original bytes —
// a job the provider rejects (400) ends `failed` with the provider's code,
// and every good job of the same run succeeds exactly once.
func TestFaultPoison(t *testing.T) {
	const good = 150
	s := newFaultStack(t, faultOptions{
		Sim: sim.Config{Latency: sim.LatencyConfig{TTFT: sim.Duration(5 * time.Millisecond)}},
		Wrap: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := readAllLimited(r)
				if strings.Contains(string(body), "[job:reject-") {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusBadRequest)
					fmt.Fprint(w, `{"error":{"message":"Input data may contain inappropriate content.","type":"invalid_request_error","code":"data_inspection_failed"}}`)
					return
				}
				next.ServeHTTP(w, r)
			})
		},
		YAML: "limits:\n  max_payload_bytes: 8192\n  max_output_tokens: 4096\n",
	})

	poison := map[string]string{ // body → what its reason must say
		`{"id":"poison-json","model":"qwen-plus","request":{`:                                       "truncated JSON",
		`{"id":"poison-syntax","model":}`:                                                           "malformed JSON",
		`{"id":"poison-types","model":"qwen-plus","max_attempts":"five","request":{"messages":[]}}`: "max_attempts",
		`{"id":"poison-field","model":"qwen-plus","sneaky":true,"request":{"messages":[]}}`:         "sneaky",
		`[1,2,3]`: "JSON object",
		`{"id":"poison-model","model":"gpt-imaginary","request":{"messages":[{"role":"user","content":"x"}]}}`:                           "not a configured model",
		`{"id":"poison-tokens","model":"qwen-plus","request":{"messages":[{"role":"user","content":"x"}],"max_tokens":1000000000000}}`:   "max_tokens",
		`{"id":"x'; DROP TABLE jobs;--","model":"qwen-plus","request":{"messages":[{"role":"user","content":"x"}]}}`:                     "id",
		`{"id":"../../etc/passwd","model":"qwen-plus","request":{"messages":[{"role":"user","content":"x"}]}}`:                           "id",
		"{\"id\":\"poison-utf8\",\"model\":\"qwen-plus\",\"request\":{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}}":     "UTF-8",
		`{"id":"poison-big","model":"qwen-plus","request":{"messages":[{"role":"user","content":"` + strings.Repeat("A", 9000) + `"}]}}`: "byte limit",
		``: "empty",
	}
	bodies := map[string][]byte{}
	want := map[string]string{}
	for i := range good {
		id := fmt.Sprintf("good-%04d", i)
		bodies[id] = faultJob(id, "")
		want[id] = "succeeded"
	}
	for i := range 3 {
		id := fmt.Sprintf("reject-%d", i)
		bodies[id] = faultJob(id, "")
		want[id] = "failed"
	}
	i := 0
	for body := range poison {
		bodies[fmt.Sprintf("poison-key-%d", i)] = []byte(body)
		i++
	}
	// A poison message whose id can be read is a failed job under that id,
	// with the reason: it is polled like any other.
	readable := []string{"poison-types", "poison-field", "poison-model", "poison-tokens", "poison-utf8", "poison-big"}
	for _, id := range readable {
		want[id] = "failed"
	}
	s.publish(bodies)

	c := s.consumer("poison-1")
	s.waitTerminal(good+3+len(readable), c)
	s.waitFor("a dead_letters row per poison message", func() bool {
		var n int
		require.NoError(t, s.pool.QueryRow(context.Background(), `SELECT count(*) FROM dead_letters`).Scan(&n))
		return n >= len(poison)
	}, c)
	s.stopAll(c)

	l := s.settle("poison messages mixed with good jobs", want, fmt.Sprintf("%d poison dead-lettered with reasons (%d of them failed jobs under their id), %d good succeeded, 3 provider-rejected failed", len(poison), len(readable), good))
	require.Zero(t, l.Lost)
	require.Zero(t, l.DuplicateResults)
	require.Equal(t, good, l.ByStatus["succeeded"])
	require.Equal(t, 3+len(readable), l.ByStatus["failed"], "poison with a readable id failed under it; no other became a job")
	for _, id := range readable {
		require.Zero(t, s.callsFor(id), "poison %s reached no provider", id)
	}

	// Postgres: one row per poison message, original bytes, precise reason.
	rows, err := s.pool.Query(context.Background(), `SELECT body, reason FROM dead_letters`)
	require.NoError(t, err)
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var body []byte
		var reason string
		require.NoError(t, rows.Scan(&body, &reason))
		must, ok := poison[string(body)]
		require.True(t, ok, "dead letter of an unknown body %q (%s)", body, reason)
		require.Contains(t, reason, must, "reason of %q", truncate(string(body), 80))
		seen++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(poison), seen)

	// The provider's rejection is a permanent failure with its code.
	var code string
	require.NoError(t, s.pool.QueryRow(context.Background(),
		`SELECT errors->0->>'code' FROM jobs WHERE id = 'reject-0'`).Scan(&code))
	require.Equal(t, "data_inspection_failed", code)
	require.Equal(t, 1, s.callsFor("reject-0"), "a permanent 400 is not retried")
}

// TestFaultProviderFaults promises bounded, deadline-respecting retries
// under a faulty provider: 15% 5xx, 5% requests that hang until the
// client's 1 s timeout, 5% reset connections and slow streamed answers.
// Every ordinary job succeeds exactly once; jobs whose every call fails
// (a 5xx storm) end `dead` after exactly max_attempts calls; a job with a
// near deadline ends `dead` with reason "deadline passed" well before its
// attempts run out; nothing is left non-terminal.
func TestFaultProviderFaults(t *testing.T) {
	const good, storm, near = 150, 4, 3
	s := newFaultStack(t, faultOptions{
		Sim: sim.Config{
			Latency: sim.LatencyConfig{TTFT: sim.Duration(5 * time.Millisecond), TPT: sim.Duration(time.Millisecond)},
			Faults:  sim.FaultConfig{Seed: 7, ErrorRate: 0.15, TimeoutRate: 0.05, ResetRate: 0.05},
		},
		Wrap: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := readAllLimited(r)
				if b := string(body); strings.Contains(b, "[job:storm-") || strings.Contains(b, "[job:near-") {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusServiceUnavailable)
					fmt.Fprint(w, `{"error":{"message":"The server is overloaded","type":"server_error","code":"service_unavailable"}}`)
					return
				}
				next.ServeHTTP(w, r)
			})
		},
		YAML: "", // provider timeout set below through the environment
	})
	s.env = append(s.env, "LLMQ_PROVIDER_TIMEOUT=1s", "LLMQ_PROVIDER_STREAM=true")

	bodies := map[string][]byte{}
	want := map[string]string{}
	for i := range good {
		id := fmt.Sprintf("flaky-%04d", i)
		bodies[id] = faultJob(id, `,"max_attempts":12`)
		want[id] = "succeeded"
	}
	for i := range storm {
		id := fmt.Sprintf("storm-%d", i)
		bodies[id] = faultJob(id, `,"max_attempts":3`)
		want[id] = "dead"
	}
	deadline := time.Now().Add(4 * time.Second).UTC().Format(time.RFC3339Nano)
	for i := range near {
		id := fmt.Sprintf("near-%d", i)
		bodies[id] = faultJob(id, `,"max_attempts":50,"deadline":`+jsonString(deadline))
		want[id] = "dead"
	}
	c := s.consumer("faults-1")
	s.publish(bodies)
	s.waitTerminal(len(want), c)
	s.stopAll(c)

	l := s.settle("provider faults (15% 5xx, 5% hangs, 5% resets, slow streams)", want,
		fmt.Sprintf("%d succeeded; %d 5xx-storm jobs dead after max_attempts; %d near-deadline jobs dead on deadline", good, storm, near))
	require.Zero(t, l.Lost)
	require.Zero(t, l.DuplicateResults)
	require.Zero(t, s.countWhere(`status NOT IN ('succeeded','failed','dead','cancelled')`), "nothing stuck")

	ctx := context.Background()
	for i := range storm {
		id := fmt.Sprintf("storm-%d", i)
		var attempts int
		var reason string
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT j.attempts, d.reason FROM jobs j JOIN dead_letters d ON d.tenant = j.tenant AND d.job_id = j.id WHERE j.id = $1`, id).Scan(&attempts, &reason))
		require.Equal(t, 3, attempts, id)
		require.Equal(t, 3, s.callsFor(id), "%s: exactly max_attempts calls", id)
		require.Contains(t, reason, "attempts exhausted", id)
	}
	for i := range near {
		id := fmt.Sprintf("near-%d", i)
		var attempts int
		var reason string
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT j.attempts, d.reason FROM jobs j JOIN dead_letters d ON d.tenant = j.tenant AND d.job_id = j.id WHERE j.id = $1`, id).Scan(&attempts, &reason))
		require.Equal(t, "deadline passed", reason, id)
		require.Less(t, attempts, 50, "%s: the deadline ends it, not the attempts", id)
	}
	var maxAttempts int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT coalesce(max(attempts), 0) FROM jobs WHERE id LIKE 'flaky-%'`).Scan(&maxAttempts))
	t.Logf("flaky jobs needed at most %d attempts; %d provider calls for %d jobs", maxAttempts, l.Calls, len(want))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
