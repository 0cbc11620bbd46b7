package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ratecontrol"
)

// seen is what one test provider received.
type seen struct {
	model, auth, project string
}

// recordingProvider answers every chat call and sends what it saw on got.
func recordingProvider(got chan<- seen) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(body, &req)
		got <- seen{model: req.Model, auth: r.Header.Get("Authorization"), project: r.Header.Get("OpenAI-Project")}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}
}

func TestRouterSendsEachModelToItsProvider(t *testing.T) {
	gotA, gotB := make(chan seen, 1), make(chan seen, 1)
	a := newClient(t, recordingProvider(gotA), nil)
	b := newClient(t, recordingProvider(gotB), func(c *Config) {
		c.APIKey = "sk-provider-b-9876543210"
		c.Headers = map[string]config.Secret{"openai-project": "proj-b-secret"}
	})
	r := NewRouter(map[string]Route{
		"qwen-plus":   {Client: a, Upstream: "qwen-plus"},
		"qwen-plus-b": {Client: b, Upstream: "qwen-plus"},
	}, a)
	ctx := context.Background()
	body := []byte(`{"messages":[{"role":"user","content":"hi"}]}`)

	resp, err := r.Chat(ctx, "qwen-plus-b", body)
	require.NoError(t, err)
	require.Equal(t, "qwen-plus-b", resp.Model)
	require.Equal(t, seen{model: "qwen-plus", auth: "Bearer sk-provider-b-9876543210", project: "proj-b-secret"}, <-gotB)

	_, err = r.Chat(ctx, "qwen-plus", body)
	require.NoError(t, err)
	require.Equal(t, seen{model: "qwen-plus", auth: "Bearer " + testKey}, <-gotA)

	// A model without a route goes to the unlisted client by its own name.
	_, err = r.Chat(ctx, "qwen-max", body)
	require.NoError(t, err)
	require.Equal(t, "qwen-max", (<-gotA).model)
}

func TestRouterWithoutUnlistedFailsTheCall(t *testing.T) {
	r := NewRouter(map[string]Route{}, nil)
	_, err := r.Chat(context.Background(), "qwen-max", []byte(`{}`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, ratecontrol.KindClient, pe.Class.Kind)
	require.False(t, pe.Class.Kind.Retryable())
}

func TestHeaderValuesNeverEchoed(t *testing.T) {
	const project = "proj-secret-55555"
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(400)
		fmt.Fprintf(w, `{"error":{"message":"bad project %s, version %s","code":"%s"}}`,
			r.Header.Get("OpenAI-Project"), r.Header.Get("OpenAI-Beta"), r.Header.Get("OpenAI-Project"))
	}, func(c *Config) {
		c.Headers = map[string]config.Secret{"OpenAI-Project": project, "OpenAI-Beta": "v2"}
	})
	_, err := c.Chat(context.Background(), "m", []byte(`{"messages":[]}`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.NotContains(t, err.Error(), project)
	require.NotContains(t, pe.Class.Code, project)
	// A value too short to be a credential stays readable.
	require.Contains(t, pe.Class.Message, "version v2")
}
