package launch

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withPprof serves a heap profile and leaves every other path to the
// handler it wraps.
func TestWithPprof(t *testing.T) {
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "inner "+r.URL.Path) })
	srv := httptest.NewServer(withPprof(inner))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body := get("/debug/pprof/heap?debug=1")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "heap profile")
	_, body = get("/metrics")
	assert.Equal(t, "inner /metrics", body)
}
