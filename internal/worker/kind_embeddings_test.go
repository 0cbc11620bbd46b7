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

func embeddingsBody(id, model string, inputs []string, extra map[string]any) []byte {
	j := map[string]any{"id": id, "model": model, "kind": "embeddings", "request": map[string]any{"input": inputs}}
	for k, v := range extra {
		j[k] = v
	}
	b, _ := json.Marshal(j)
	return b
}

// Embeddings jobs call /embeddings, are admitted on RPM and on the input
// tokens of the whole batch (no output booked), and store the provider's
// list object as their response with its usage.
func TestEmbeddingsJobsEndToEnd(t *testing.T) {
	t.Parallel()
	const n = 30
	// Within one minute of quota, so the test takes seconds:
	// integration/kinds_test.go paces past a minute of TPM.
	models := map[string]config.Model{"emb": {Kind: "embeddings", RPM: 600, TPM: 3000}}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"emb": {Kind: sim.KindEmbeddings, RPM: 600, TPM: 3000}}}, models)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	bodies := make([][]byte, n)
	inputs := make([][]string, n)
	for i := range n {
		// 3 inputs of ~25 tokens: a batch the estimate must count whole.
		inputs[i] = []string{fmt.Sprintf("%0100d", i), fmt.Sprintf("%0100d", i+1), fmt.Sprintf("%0100d", i+2)}
		bodies[i] = embeddingsBody(fmt.Sprintf("e-%d", i), "emb", inputs[i], nil)
	}
	h.submitMany(mem.Publisher(), bodies)
	h.start(mem.Subscriber(), h.cfg)
	require.Equal(t, map[string]int{"succeeded": n}, h.wait(n, 90*time.Second))

	ctx := context.Background()
	for i := range n {
		rec, err := h.store.Get(ctx, job.Key{Tenant: job.DefaultTenant, ID: fmt.Sprintf("e-%d", i)})
		require.NoError(t, err)
		require.Equal(t, job.StatusSucceeded, rec.Status)
		require.Equal(t, job.KindEmbeddings, rec.Kind)
		var resp struct {
			Object string `json:"object"`
			Data   []struct {
				Embedding []float64 `json:"embedding"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal(rec.Response, &resp))
		require.Equal(t, "list", resp.Object)
		require.Len(t, resp.Data, len(inputs[i]), "one vector per input of the batch")
		want, err := sim.EstimateEmbeddingTokens(must(json.Marshal(map[string]any{"input": inputs[i]})))
		require.NoError(t, err)
		require.Equal(t, int(want), rec.PromptTokens)
		require.Zero(t, rec.CompletionTokens)
	}
	st := h.sim.Stats().Models["emb"]
	require.EqualValues(t, n, st.Admitted)
	require.Zero(t, st.OutputTokens)
	require.Zero(t, st.RateLimitedTotal, "admission kept inside RPM and input-only TPM: %v", st.RateLimited)
	for reason, v := range st.Overruns {
		require.Zero(t, v, "overrun of %s", reason)
	}
	// The batches' 2250 input tokens fit a TPM of 3000 only because no
	// output is booked: auto's prior of 512 output tokens a call would
	// have held most of them back for the next minute.
	require.Greater(t, st.InputTokens, int64(2000))
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// An embeddings job that is rate limited falls back only to a model that
// serves embeddings: a chat model earlier in the chain is skipped.
func TestEmbeddingsFallBackOnlyToEmbeddingModels(t *testing.T) {
	t.Parallel()
	models := map[string]config.Model{
		// The retry strategy admits everything, so the primary's 429s are real.
		"emb-a":  {Kind: "embeddings", Strategy: "retry", Fallback: []string{"chat-b", "emb-b"}},
		"chat-b": {Strategy: "retry"},
		"emb-b":  {Kind: "embeddings", Strategy: "retry"},
	}
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{
		"emb-a":  {Kind: sim.KindEmbeddings, RPM: 1}, // limited after its first request
		"chat-b": {},
		"emb-b":  {Kind: sim.KindEmbeddings},
	}}, models)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	pub := mem.Publisher()
	h.submit(pub, job.PriorityHigh, "warm", embeddingsBody("warm", "emb-a", []string{"x"}, nil))
	h.start(mem.Subscriber(), h.cfg)
	require.Equal(t, map[string]int{"succeeded": 1}, h.wait(1, 30*time.Second))
	h.submit(pub, job.PriorityNormal, "fb", embeddingsBody("fb", "emb-a", []string{"a", "b"}, nil))
	require.Equal(t, map[string]int{"succeeded": 1}, h.wait(1, 60*time.Second))
	rec, err := h.store.Get(context.Background(), job.Key{Tenant: job.DefaultTenant, ID: "fb"})
	require.NoError(t, err)
	require.Equal(t, "emb-b", rec.ModelUsed)
	require.Zero(t, h.sim.Stats().Models["chat-b"].Requests, "never sent to the chat model")
}

func TestCandidatesKeepTheJobsKind(t *testing.T) {
	w := &Worker{cfg: Config{Models: map[string]config.Model{
		"emb-a":  {Kind: "embeddings", Fallback: []string{"chat-b", "emb-b"}},
		"chat-a": {Fallback: []string{"emb-b", "chat-b"}},
		"chat-b": {},
		"emb-b":  {Kind: "embeddings"},
	}}}
	require.Equal(t, []string{"emb-a", "emb-b"}, w.candidates(&job.Job{Model: "emb-a", Kind: job.KindEmbeddings}))
	require.Equal(t, []string{"chat-a", "chat-b"}, w.candidates(&job.Job{Model: "chat-a"}))
	require.Equal(t, []string{"emb-a", "emb-b"}, w.candidates(&job.Job{Model: "emb-a", Kind: job.KindEmbeddings, FallbackModels: []string{"chat-b", "emb-b"}}))
}
