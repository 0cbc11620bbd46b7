package sim

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// postTo sends body to path straight to the handler.
func postTo(s http.Handler, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

// A batch of three 40-character inputs is 30 input tokens and no output:
// TPM 100 admits three batches and refuses the fourth on tokens.
func TestEmbeddingsChargeTheBatchsInputOnly(t *testing.T) {
	s := newSim(t, Config{Models: map[string]ModelConfig{
		"emb": {Kind: KindEmbeddings, TPM: 100, RPM: 10},
		"m":   {},
	}})
	text := strings.Repeat("abcd", 10)
	body := `{"model":"emb","input":["` + text + `","` + text + `","` + text + `"],"dimensions":4}`
	n, err := EstimateEmbeddingTokens([]byte(body))
	require.NoError(t, err)
	require.Equal(t, int64(30), n)
	for range 3 {
		rec := postTo(s, "/v1/embeddings", body)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var out struct {
			Data []struct {
				Index     int       `json:"index"`
				Embedding []float64 `json:"embedding"`
			} `json:"data"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
				TotalTokens  int `json:"total_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
		require.Len(t, out.Data, 3)
		require.Equal(t, 2, out.Data[2].Index)
		require.Len(t, out.Data[0].Embedding, 4)
		var norm float64
		for _, x := range out.Data[0].Embedding {
			norm += x * x
		}
		require.InDelta(t, 1, math.Sqrt(norm), 1e-3)
		require.Equal(t, 30, out.Usage.PromptTokens)
		require.Equal(t, 30, out.Usage.TotalTokens)
	}
	requireCode(t, postTo(s, "/v1/embeddings", body), http.StatusTooManyRequests, "insufficient_quota")
	st := s.Stats().Models["emb"]
	require.Equal(t, int64(3), st.Admitted)
	require.Equal(t, int64(90), st.InputTokens)
	require.Equal(t, int64(1), st.RateLimited[ReasonTPM])
	for r, v := range st.Overruns {
		require.Zero(t, v, "overrun of %s", r)
	}
}

func TestEmbeddingsRPMAndDashScopeCodes(t *testing.T) {
	s := newSim(t, Config{Dialect: DialectDashScope, Models: map[string]ModelConfig{"emb": {Kind: KindEmbeddings, RPM: 2}}})
	for range 2 {
		require.Equal(t, http.StatusOK, postTo(s, "/compatible-mode/v1/embeddings", `{"model":"emb","input":"hello"}`).Code)
	}
	rec := postTo(s, "/compatible-mode/v1/embeddings", `{"model":"emb","input":"hello"}`)
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, "Throttling.RateQuota", decodeErr(t, rec).Code)
}

// A model serves its own kind only: chat on an embedding model and
// embeddings on a chat model are refused before admission.
func TestEmbeddingsKindChecked(t *testing.T) {
	s := newSim(t, Config{Models: map[string]ModelConfig{"emb": {Kind: KindEmbeddings}, "m": {}}})
	requireCode(t, postTo(s, "/v1/embeddings", `{"model":"m","input":"x"}`), http.StatusBadRequest, "model_not_supported")
	requireCode(t, post(s, chatBody("emb", "hi", "")), http.StatusBadRequest, "model_not_supported")
	requireCode(t, postTo(s, "/v1/embeddings", `{"model":"nope","input":"x"}`), http.StatusNotFound, "model_not_found")
	for _, bad := range []string{`{"model":"emb"}`, `{"model":"emb","input":[]}`, `{"model":"emb","input":[""]}`,
		`{"model":"emb","input":"x","dimensions":0}`, `{"model":"emb","input":[{"a":1}]}`} {
		requireCode(t, postTo(s, "/v1/embeddings", bad), http.StatusBadRequest, "invalid_parameter_error")
	}
	require.Zero(t, s.Stats().Models["emb"].Requests+s.Stats().Models["m"].Requests)
	_, err := New(Config{Models: map[string]ModelConfig{"x": {Kind: "video"}}})
	require.ErrorContains(t, err, "models.x.kind")
}
