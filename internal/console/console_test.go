package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
)

// TestMount: /ui/ serves the embedded console with its security headers,
// /ui redirects there, and everything else (a POST under /ui/ too) is the
// API's.
func TestMount(t *testing.T) {
	t.Parallel()
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-From", "api")
		w.WriteHeader(http.StatusTeapot)
	})
	srv := httptest.NewServer(console.Mount(api))
	defer srv.Close()
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := client.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(body)
	}
	resp, body := get("/ui/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `<script type="module" src="app.js">`)
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'")
	assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))

	for _, asset := range []string{"app.js", "app.css", "overview.js", "jobs.js", "job.js", "dlq.js", "usage.js", "chart.js", "dom.js"} {
		resp, _ := get("/ui/" + asset)
		assert.Equal(t, http.StatusOK, resp.StatusCode, asset)
	}
	resp, _ = get("/ui/app.js")
	assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/javascript"), resp.Header.Get("Content-Type"))

	resp, _ = get("/ui")
	assert.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
	assert.Equal(t, "/ui/", resp.Header.Get("Location"))

	resp, _ = get("/v1/status")
	assert.Equal(t, "api", resp.Header.Get("X-From"))
	post, err := client.Post(srv.URL+"/ui/app.js", "text/plain", nil)
	require.NoError(t, err)
	post.Body.Close()
	assert.Equal(t, "api", post.Header.Get("X-From"), "only GET and HEAD are the console's")
}
