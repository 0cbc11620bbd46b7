package sim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTransportInsideSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := oneModel(ModelConfig{RPM: 1, Latency: &LatencyConfig{TTFT: Duration(time.Second)}})
		s := newSim(t, cfg)
		client := &http.Client{Transport: s.Transport()}
		body := chatBody("m", "hi", "")
		start := time.Now()
		resp, err := client.Post("http://llmsim/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		require.Equal(t, time.Second, time.Since(start))
		var c completion
		require.NoError(t, json.Unmarshal(b, &c))
		require.Equal(t, ExpectedContent([]byte(body)), c.Choices[0].Message.Content)

		resp, err = client.Post("http://llmsim/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	})
}

func TestTransportFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := oneModel(ModelConfig{})
		cfg.Faults = FaultConfig{ResetRate: 1}
		s := newSim(t, cfg)
		client := &http.Client{Transport: s.Transport()}
		_, err := client.Post("http://llmsim/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", "hi", "")))
		require.ErrorIs(t, err, ErrConnectionReset)

		cfg.Faults = FaultConfig{TimeoutRate: 1}
		s = newSim(t, cfg)
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://llmsim/v1/chat/completions", strings.NewReader(chatBody("m", "hi", "")))
		start := time.Now()
		_, err = (&http.Client{Transport: s.Transport()}).Do(req)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, 5*time.Second, time.Since(start))
	})
}
