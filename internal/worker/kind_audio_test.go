package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
)

// Audio jobs call /audio/transcriptions, are admitted on RPM and on their
// audio seconds (not tokens), and store the provider's transcript; the
// seconds the provider billed settle the admission.
func TestAudioJobsEndToEnd(t *testing.T) {
	t.Parallel()
	const n = 8
	models := map[string]config.Model{"asr": {Kind: "audio", RPM: 60, AudioSecondsPerMinute: 200, Warmup: -1}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"asr": {Kind: sim.KindAudio, RPM: 60, AudioSecondsPerMinute: 200}}}, models)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	bodies := make([][]byte, n)
	for i := range n {
		b, err := json.Marshal(map[string]any{"id": fmt.Sprintf("a-%d", i), "model": "asr", "kind": "audio",
			"request": map[string]any{"duration_seconds": 10.3 + float64(i), "language": "en"}})
		require.NoError(t, err)
		bodies[i] = b
	}
	h.submitMany(mem.Publisher(), bodies)
	h.start(mem.Subscriber(), h.cfg)
	require.Equal(t, map[string]int{"succeeded": n}, h.wait(n, 60*time.Second))

	var billed int64
	for i := range n {
		rec, err := h.store.Get(context.Background(), job.Key{Tenant: job.DefaultTenant, ID: fmt.Sprintf("a-%d", i)})
		require.NoError(t, err)
		require.Equal(t, job.StatusSucceeded, rec.Status)
		var resp struct {
			Text  string `json:"text"`
			Usage struct {
				Seconds int64 `json:"seconds"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(rec.Response, &resp))
		require.NotEmpty(t, resp.Text)
		require.Equal(t, sim.AudioSeconds(10.3+float64(i)), resp.Usage.Seconds)
		billed += resp.Usage.Seconds
		require.Zero(t, rec.PromptTokens+rec.CompletionTokens, "an audio call uses no tokens")
	}
	st := h.sim.Stats().Models["asr"]
	require.EqualValues(t, n, st.Admitted)
	require.Equal(t, billed, st.InputTokens, "llmsim counted the same seconds")
	require.Zero(t, st.RateLimitedTotal, "%v", st.RateLimited)
	for r, v := range st.Overruns {
		require.Zero(t, v, r)
	}
}
