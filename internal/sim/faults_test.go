package sim

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func statusSequence(t *testing.T, seed uint64, n int) []int {
	cfg := oneModel(ModelConfig{})
	cfg.Faults = FaultConfig{Seed: seed, ErrorRate: 0.3}
	s := newSim(t, cfg)
	out := make([]int, n)
	for i := range out {
		out[i] = hi(s).Code
	}
	return out
}

func TestFaultsDeterministicUnderSeed(t *testing.T) {
	a, b, c := statusSequence(t, 7, 200), statusSequence(t, 7, 200), statusSequence(t, 8, 200)
	require.Equal(t, a, b)
	require.NotEqual(t, a, c)
	counts := map[int]int{}
	for _, code := range a {
		counts[code]++
	}
	require.Len(t, counts, 3) // 200, 500, 503
	require.InDelta(t, 60, counts[500]+counts[503], 25)
}

func TestFaultBodiesAndAccounting(t *testing.T) {
	cfg := oneModel(ModelConfig{RPM: 100})
	cfg.Faults = FaultConfig{ErrorRate: 1}
	s := newSim(t, cfg)
	for range 10 {
		rec := hi(s)
		require.Contains(t, []int{500, 503}, rec.Code)
		require.Equal(t, "server_error", decodeErr(t, rec).Error.Type)
	}
	st := s.Stats().Models["m"]
	require.Equal(t, int64(10), st.Faults["error_500"]+st.Faults["error_503"])
	// Faulted requests count against the quota with their input tokens only.
	require.Equal(t, int64(10), st.Admitted)
	require.Equal(t, int64(80), st.Tokens)
	require.Zero(t, st.InFlight)
}

func TestTimeoutFaultAnswers504AfterConfiguredTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := oneModel(ModelConfig{})
		cfg.Faults = FaultConfig{TimeoutRate: 1, Timeout: Duration(30 * time.Second)}
		s := newSim(t, cfg)
		start := time.Now()
		rec := hi(s)
		requireCode(t, rec, http.StatusGatewayTimeout, "timeout")
		require.Equal(t, 30*time.Second, time.Since(start))
	})
}

func TestResetFaultDropsConnection(t *testing.T) {
	cfg := oneModel(ModelConfig{})
	cfg.Faults = FaultConfig{ResetRate: 1}
	s := newSim(t, cfg)
	srv := httptest.NewServer(s)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	resp, err := client.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", "hi", "")))
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	require.Error(t, err)
	require.Equal(t, int64(1), s.Stats().Models["m"].Faults["reset"])
}
