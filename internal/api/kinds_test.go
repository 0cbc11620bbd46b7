package api_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

func withKinds(c *api.Config) {
	c.Models = map[string]config.Model{"qwen-plus": {}, "text-embedding-v3": {Kind: "embeddings"}, "emb-2": {Kind: "embeddings"}}
}

// A job whose kind its model does not serve is refused at submission,
// naming the field, and nothing is stored; a job of the model's kind is
// accepted and its kind is in its document and its request view.
func TestKindTheModelDoesNotServeIsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withKinds)
	emb := map[string]any{"input": []string{"a", "b"}}
	cases := []struct {
		id    string
		over  map[string]any
		field string
		msg   string
	}{
		{"k1", map[string]any{"kind": "embeddings", "request": emb}, "model", `"qwen-plus" serves chat jobs, not embeddings jobs`},
		{"k2", map[string]any{"model": "text-embedding-v3"}, "model", `"text-embedding-v3" serves embeddings jobs, not chat jobs`},
		{"k3", map[string]any{"model": "text-embedding-v3", "kind": "embeddings", "request": emb, "fallback_models": []string{"emb-2", "qwen-plus"}},
			"fallback_models[1]", `"qwen-plus" serves chat jobs`},
		{"k4", map[string]any{"kind": "image"}, "kind", "must be one of chat, embeddings, task, audio"},
		{"k5", map[string]any{"model": "text-embedding-v3", "kind": "embeddings", "request": map[string]any{"input": []string{}}}, "request.input", "non-empty"},
	}
	for _, c := range cases {
		r := h.do("POST", "/v1/jobs", keyAcme, jobBody(c.id, c.over))
		require.Equal(t, http.StatusBadRequest, r.Code, "%s: %s", c.id, r.Body)
		assert.Equal(t, c.field, r.apiError(t).Error.Field, c.id)
		assert.Contains(t, r.apiError(t).Error.Message, c.msg, c.id)
		_, err := h.store.Get(context.Background(), job.Key{Tenant: "acme", ID: c.id})
		require.ErrorIs(t, err, store.ErrNotFound, "%s: nothing stored", c.id)
	}

	r := h.do("POST", "/v1/jobs", keyAcme, jobBody("ok", map[string]any{"model": "text-embedding-v3", "kind": "embeddings", "request": emb,
		"fallback_models": []string{"emb-2"}}))
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	rec, err := h.store.Get(context.Background(), job.Key{Tenant: "acme", ID: "ok"})
	require.NoError(t, err)
	require.Equal(t, job.KindEmbeddings, rec.Kind, "stored with its kind")
	var doc struct {
		Kind string `json:"kind"`
	}
	h.do("GET", "/v1/jobs/ok", keyAcme, nil).json(t, &doc)
	require.Equal(t, "embeddings", doc.Kind)
	h.do("GET", "/v1/jobs/ok/request", keyAcme, nil).json(t, &doc)
	require.Equal(t, "embeddings", doc.Kind)

	require.Equal(t, http.StatusAccepted, h.do("POST", "/v1/jobs", keyAcme, jobBody("chat", nil)).Code)
	h.do("GET", "/v1/jobs/chat", keyAcme, nil).json(t, &doc)
	require.Equal(t, "chat", doc.Kind, "a job that names no kind is chat")
}
