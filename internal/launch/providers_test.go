package launch

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
)

func TestProviderRouterNeedsTheURLsOfProvidersInUse(t *testing.T) {
	// An old config without a base URL fails as it always did.
	cfg, err := config.Parse([]byte("models:\n  qwen-plus: {}\n"), nil)
	require.NoError(t, err)
	_, _, err = providerRouter(cfg, Options{})
	require.ErrorContains(t, err, "LLMQ_PROVIDER_BASE_URL")

	// The default provider is not needed when every model names another.
	cfg, err = config.Parse([]byte("providers:\n  eu: {base_url: 'http://127.0.0.1:1/v1'}\nmodels:\n  qwen-plus: {provider: eu}\n"), nil)
	require.NoError(t, err)
	r, closeAll, err := providerRouter(cfg, Options{})
	require.NoError(t, err)
	closeAll()
	require.NotNil(t, r)
}

func TestProviderRouterCallsEachModelsProvider(t *testing.T) {
	served := func(name string, got chan<- string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got <- name + " " + r.Header.Get("Authorization")
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[{"message":{"content":"ok"}}]}`)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	got := make(chan string, 1)
	a, b := served("a", got), served("b", got)
	cfg, err := config.Parse([]byte(`
provider: {base_url: "`+a.URL+`/v1", api_key: sk-a-key}
providers:
  b: {base_url: "`+b.URL+`/v1", api_key: sk-b-key}
models:
  qwen-plus: {}
  qwen-plus-b: {provider: b, upstream: qwen-plus}
`), nil)
	require.NoError(t, err)
	r, closeAll, err := providerRouter(cfg, Options{})
	require.NoError(t, err)
	defer closeAll()
	for model, want := range map[string]string{"qwen-plus": "a Bearer sk-a-key", "qwen-plus-b": "b Bearer sk-b-key"} {
		_, err := r.Chat(context.Background(), model, []byte(`{"messages":[]}`))
		require.NoError(t, err)
		require.Equal(t, want, <-got)
	}
	byKey, modelOf := quotaModels(cfg)
	require.Len(t, byKey, 2)
	require.Equal(t, map[string]string{"qwen-plus": "qwen-plus", "b/qwen-plus": "qwen-plus-b"}, modelOf)
}
