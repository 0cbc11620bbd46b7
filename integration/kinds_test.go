package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// The embeddings scenario: batches whose tokens, all inputs counted, are
// more than one minute of TPM, so admission must pace them by their input
// tokens (an estimate of the first input alone, or an output booked for
// each, would be refused or crawl).
const (
	embJobs   = 50
	embInputs = 3   // inputs per job
	embRPM    = 120 // requests per minute, llmq and llmsim alike
	embTPM    = 3000
)

// kindsConsumer starts llmsim with cfg's models and a consumer over real
// RabbitMQ and Postgres configured with modelsYAML, and returns the
// simulator, a publisher to the intake and a pool on the test's database.
func kindsConsumer(t *testing.T, simCfg sim.Config, modelsYAML string) (simServer, *rabbitmq.Publisher, *pgxpool.Pool, *lockedBuffer) {
	t.Helper()
	pgURL := testsvc.PostgresURL(t)
	amqpURL := testVhost(t, testsvc.AMQPURL(t))
	s := startSim(t, simCfg)
	yaml := fmt.Sprintf(`
broker: rabbitmq
http_addr: 127.0.0.1:0
metrics_addr: 127.0.0.1:0
provider: {base_url: "%s/v1", timeout: 20s}
worker: {lease: 5s, retry_base: 50ms, retry_max: 500ms, shutdown_grace: 5s}
%s`, s.url, modelsYAML)
	env := map[string]string{"LLMQ_POSTGRES_URL": pgURL, "LLMQ_AMQP_URL": amqpURL, "LLMQ_PROVIDER_API_KEY": "sk-kinds-test"}
	cfg, err := config.Parse([]byte(yaml), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	require.NoError(t, err)
	cfg.Worker.ID = "kinds-consumer"
	logs := &lockedBuffer{}
	runConsumer(t, cfg, slog.New(slog.NewJSONHandler(logs, nil)))
	ctx := context.Background()
	pub, err := rabbitmq.NewPublisher(ctx, rabbitmq.Config{URL: amqpURL})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	pool, err := pgxpool.New(ctx, pgURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return s, pub, pool, logs
}

// waitFinished polls Postgres until n jobs have ended, or fails after within.
func waitFinished(t *testing.T, pool *pgxpool.Pool, n int, within time.Duration, logs *lockedBuffer) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for {
		var done int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status IN ('succeeded','failed','dead','cancelled')`).Scan(&done))
		if done >= n {
			return
		}
		if time.Now().After(deadline) {
			var statuses string
			require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(string_agg(status || ':' || n, ' '), '') FROM (SELECT status, count(*) n FROM jobs GROUP BY status) s`).Scan(&statuses))
			t.Fatalf("only %d of %d jobs ended within %s: %s; log tail:\n%s", done, n, within, statuses, logs.tail(20))
		}
		waitABit(ctx)
	}
}

// requireNoOverruns asserts llmsim's referee saw no window over a limit,
// in any unit, and that it refused nothing.
func requireNoOverruns(t *testing.T, name string, st sim.ModelStats) {
	t.Helper()
	for unit, n := range st.Overruns {
		require.Zero(t, n, "%s: overruns of %s", name, unit)
	}
	require.Zero(t, st.RateLimitedTotal, "%s: 429s %v", name, st.RateLimited)
}

// TestEmbeddingsJobsEndToEnd: embeddings jobs published to the intake run
// over RabbitMQ and Postgres on /v1/embeddings, admitted on RPM and on the
// input tokens of their whole batch; llmsim sees no 429 and no overrun in
// any unit, every job stores the provider's vectors and usage, and an
// embeddings job naming a chat model is refused at intake with the reason.
func TestEmbeddingsJobsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("paces a minute of TPM over real services: not in -short")
	}
	s, pub, pool, logs := kindsConsumer(t, sim.Config{APIKeys: []string{"sk-kinds-test"}, Models: map[string]sim.ModelConfig{
		"text-embedding-v3": {Kind: sim.KindEmbeddings, RPM: embRPM, TPM: embTPM},
		"qwen-plus":         {},
	}}, fmt.Sprintf(`models:
  text-embedding-v3: {kind: embeddings, rpm: %d, tpm: %d}
  qwen-plus: {}
`, embRPM, embTPM))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for i := range embJobs {
		inputs := make([]string, embInputs)
		for k := range inputs {
			inputs[k] = fmt.Sprintf("ticket %d, part %d: %s", i, k, strings.Repeat("refund please ", 6))
		}
		body, err := json.Marshal(map[string]any{"id": fmt.Sprintf("emb-%03d", i), "model": "text-embedding-v3", "kind": "embeddings",
			"request": map[string]any{"input": inputs, "dimensions": 16}})
		require.NoError(t, err)
		require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: fmt.Sprintf("emb-%03d", i), Body: body}))
	}
	wrong := `{"id":"emb-on-chat","model":"qwen-plus","kind":"embeddings","request":{"input":"x"}}`
	require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: "emb-on-chat", Body: []byte(wrong)}))

	waitFinished(t, pool, embJobs+1, 3*time.Minute, logs)

	st := s.sim.Stats().Models["text-embedding-v3"]
	tokens, requests := sim.SlidingMinute(st.Series)
	t.Logf("embeddings: %d requests, %d admitted, %d input tokens, most in a sliding minute %d tokens (TPM %d) and %d requests (RPM %d), 429s %v, overruns %v",
		st.Requests, st.Admitted, st.InputTokens, tokens, embTPM, requests, embRPM, st.RateLimited, st.Overruns)
	requireNoOverruns(t, "text-embedding-v3", st)
	require.EqualValues(t, embJobs, st.Admitted, "one call per job")
	require.Zero(t, st.OutputTokens)
	require.Greater(t, st.InputTokens, int64(embTPM), "the batches needed more than a minute of TPM")
	require.LessOrEqual(t, tokens, int64(embTPM))
	require.Zero(t, s.sim.Stats().Models["qwen-plus"].Requests)

	var succeeded, prompt, wrongPrompt int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(prompt_tokens), 0),
			count(*) FILTER (WHERE prompt_tokens IS NULL OR completion_tokens <> 0 OR jsonb_array_length(response->'data') <> $1)
		FROM jobs WHERE status = 'succeeded' AND kind = 'embeddings'`, embInputs).Scan(&succeeded, &prompt, &wrongPrompt))
	require.Equal(t, embJobs, succeeded)
	require.Zero(t, wrongPrompt, "every result holds one vector per input and input-only usage")
	require.EqualValues(t, st.InputTokens, prompt, "usage stored is what the provider reported")

	var status, reason string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status, errors->-1->>'message' FROM jobs WHERE id = 'emb-on-chat'`).Scan(&status, &reason))
	require.Equal(t, "failed", status)
	require.Contains(t, reason, `"qwen-plus" serves chat jobs, not embeddings jobs`)
}

// The audio scenario: more audio than one minute of the model's audio
// seconds, so admission must pace the jobs by their declared duration and
// settle them from the seconds billed.
const (
	audioJobs = 30
	audioRPM  = 60
	audioASPM = 300 // audio seconds per minute
)

// TestAudioJobsEndToEnd: audio jobs published to the intake run over
// RabbitMQ and Postgres on /v1/audio/transcriptions, admitted on RPM and
// on audio seconds per minute (the unit the model is metered in); llmsim
// sees no 429 and no overrun in either unit, and every job stores its
// transcript.
func TestAudioJobsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("paces a minute of audio seconds over real services: not in -short")
	}
	s, pub, pool, logs := kindsConsumer(t, sim.Config{APIKeys: []string{"sk-kinds-test"}, Models: map[string]sim.ModelConfig{
		"paraformer-v2": {Kind: sim.KindAudio, RPM: audioRPM, AudioSecondsPerMinute: audioASPM},
	}}, fmt.Sprintf(`models:
  paraformer-v2: {kind: audio, rpm: %d, audio_seconds_per_minute: %d}
`, audioRPM, audioASPM))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var declared int64
	for i := range audioJobs {
		d := 8.5 + float64(i%10) // 8.5 .. 17.5 s: 9 .. 18 billed
		declared += sim.AudioSeconds(d)
		id := fmt.Sprintf("asr-%03d", i)
		body := fmt.Sprintf(`{"id":%q,"model":"paraformer-v2","kind":"audio","request":{"duration_seconds":%g,"language":"en"}}`, id, d)
		require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: []byte(body)}))
	}
	waitFinished(t, pool, audioJobs, 3*time.Minute, logs)

	st := s.sim.Stats().Models["paraformer-v2"]
	seconds, requests := sim.SlidingMinute(st.Series)
	t.Logf("audio: %d requests, %d admitted, %d audio seconds, most in a sliding minute %d s (limit %d) and %d requests (RPM %d), 429s %v, overruns %v",
		st.Requests, st.Admitted, st.InputTokens, seconds, audioASPM, requests, audioRPM, st.RateLimited, st.Overruns)
	requireNoOverruns(t, "paraformer-v2", st)
	require.Contains(t, st.Overruns, sim.ReasonAudioSeconds, "llmsim refereed the audio unit")
	require.EqualValues(t, audioJobs, st.Admitted, "one call per job")
	require.Equal(t, declared, st.InputTokens)
	require.Greater(t, declared, int64(audioASPM), "the jobs needed more than a minute of audio seconds")
	require.LessOrEqual(t, seconds, int64(audioASPM))

	var succeeded, billed int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), coalesce(sum((response->'usage'->>'seconds')::bigint), 0)
		FROM jobs WHERE status = 'succeeded' AND kind = 'audio' AND response->>'text' <> ''`).Scan(&succeeded, &billed))
	require.EqualValues(t, audioJobs, succeeded)
	require.Equal(t, declared, billed)
}
