package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// fixedMix makes every reply 10 output tokens, so a request with content
// "hi" costs 8 input + 10 output = 18 tokens.
var fixedMix = &OutputMix{Short: 10, Long: 10, LongShare: 0}

const tokensPerHi = 18

func newSim(t *testing.T, cfg Config, opts ...Option) *Simulator {
	t.Helper()
	s, err := New(cfg, opts...)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func oneModel(m ModelConfig) Config {
	if m.Output == nil {
		m.Output = fixedMix
	}
	return Config{Models: map[string]ModelConfig{"m": m}}
}

func chatBody(model, content string, extra string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]%s}`, model, content, extra)
}

// post sends a chat request straight to the handler (no sockets, so it
// works inside a synctest bubble).
func post(s http.Handler, body string, headers ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

func hi(s http.Handler, headers ...string) *httptest.ResponseRecorder {
	return post(s, chatBody("m", "hi", ""), headers...)
}

type errBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
	Code      string `json:"code"`
	RequestID string `json:"request_id"`
}

func decodeErr(t *testing.T, rec *httptest.ResponseRecorder) errBody {
	t.Helper()
	var e errBody
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &e), rec.Body.String())
	return e
}

// requireCode checks the status and the OpenAI error code.
func requireCode(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	require.Equal(t, status, rec.Code, rec.Body.String())
	if code != "" {
		require.Equal(t, code, decodeErr(t, rec).Error.Code, rec.Body.String())
	}
}
