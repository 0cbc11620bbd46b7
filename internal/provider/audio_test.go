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

func TestTranscribeReadsTheBilledSeconds(t *testing.T) {
	var gotPath, gotBody string
	reply := `{"text":"hello","duration":40.2,"usage":{"type":"duration","seconds":41}}`
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotPath, gotBody = r.URL.Path, string(b)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, reply)
	}, nil)
	resp, err := c.Transcribe(context.Background(), "paraformer-v2", []byte(`{"duration_seconds":40.2}`))
	require.NoError(t, err)
	require.Equal(t, "/v1/audio/transcriptions", gotPath)
	require.Equal(t, `{"model":"paraformer-v2","duration_seconds":40.2}`, gotBody)
	require.Equal(t, 41.0, resp.AudioSeconds, "usage.seconds, what was billed")
	require.Zero(t, resp.PromptTokens)
	require.JSONEq(t, reply, string(resp.Body))

	reply = `{"text":"hello","duration":7.5}`
	resp, err = c.Transcribe(context.Background(), "paraformer-v2", []byte(`{"duration_seconds":7.5}`))
	require.NoError(t, err)
	require.Equal(t, 7.5, resp.AudioSeconds, "without usage, the duration")

	reply = `{"duration":7.5}`
	_, err = c.Transcribe(context.Background(), "paraformer-v2", []byte(`{"duration_seconds":7.5}`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, ratecontrol.KindServer, pe.Class.Kind)
}
