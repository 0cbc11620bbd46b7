package sim

import (
	"encoding/json"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStatsSeriesAndMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSim(t, oneModel(ModelConfig{RPS: 2, RPM: 100}))
		for range 3 {
			for range 3 {
				hi(s)
			}
			time.Sleep(time.Second)
		}
		st := s.Stats().Models["m"]
		require.Equal(t, int64(9), st.Requests)
		require.Equal(t, int64(6), st.Admitted)
		require.Equal(t, int64(3), st.RateLimited[ReasonRPS])
		require.Equal(t, int64(6*tokensPerHi), st.Tokens)
		require.Len(t, st.Series, 3)
		for _, sec := range st.Series {
			require.Equal(t, Second{Unix: sec.Unix, Requests: 2, Tokens: 2 * tokensPerHi, RateLimited: 1}, sec)
		}
		require.Equal(t, st.Series[0].Unix+2, st.Series[2].Unix)

		rec := get(s, "/admin/stats")
		require.Equal(t, http.StatusOK, rec.Code)
		var js Stats
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &js))
		require.Equal(t, st.Admitted, js.Models["m"].Admitted)
		require.Equal(t, int64(0), js.Models["m"].Overruns[ReasonRPS])
		require.Equal(t, int64(2), js.Models["m"].Limits.RPS)
		require.NoError(t, json.Unmarshal(get(s, "/admin/stats?series=0").Body.Bytes(), &js))
		require.Empty(t, js.Models["m"].Series)

		metrics := get(s, "/metrics").Body.String()
		require.Contains(t, metrics, `llmsim_admitted_requests_total{model="m"} 6`)
		require.Contains(t, metrics, `llmsim_rate_limited_total{model="m",reason="rps"} 3`)
		require.Contains(t, metrics, `llmsim_limit_overruns_total{limit="rpm",model="m"} 0`)
		require.Contains(t, metrics, `llmsim_limit{limit="rps",model="m"} 2`)
	})
}
