package provider

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/ratecontrol"
)

func TestEmbeddingsPassThrough(t *testing.T) {
	var gotPath, gotBody string
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotPath, gotBody = r.URL.Path, string(b)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.6,0.8]}],"usage":{"prompt_tokens":12,"total_tokens":12}}`)
	}, func(c *Config) { c.Stream = true }) // a chat setting: embeddings never stream
	resp, err := c.Embeddings(context.Background(), "text-embedding-v3", []byte(`{"input":["a","b"],"dimensions":2}`))
	require.NoError(t, err)
	require.Equal(t, "/v1/embeddings", gotPath)
	require.Equal(t, `{"model":"text-embedding-v3","input":["a","b"],"dimensions":2}`, gotBody)
	require.Equal(t, 12, resp.PromptTokens)
	require.Zero(t, resp.CompletionTokens)
	require.Contains(t, string(resp.Body), `"embedding":[0.6,0.8]`)
}

func TestEmbeddingsErrors(t *testing.T) {
	status, body := 429, `{"error":{"message":"slow down","type":"requests","code":"limit_requests"}}`
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}, nil)
	_, err := c.Embeddings(context.Background(), "e", []byte(`{"input":"x"}`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.True(t, pe.Class.Kind.RateLimited())

	status, body = 200, `{"object":"list","data":[]}`
	_, err = c.Embeddings(context.Background(), "e", []byte(`{"input":"x"}`))
	require.ErrorAs(t, err, &pe)
	require.Equal(t, ratecontrol.KindServer, pe.Class.Kind)
}
