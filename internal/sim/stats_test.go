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

func TestConcurrentClientsNeverOverrun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSim(t, oneModel(ModelConfig{RPS: 50, TPM: 120 * tokensPerHi}))
		for range 3 { // three seconds, 200 concurrent callers each
			done := make(chan int, 200)
			for range 200 {
				go func() { done <- hi(s).Code }()
			}
			ok := 0
			for range 200 {
				if <-done == http.StatusOK {
					ok++
				}
			}
			require.LessOrEqual(t, ok, 50)
			time.Sleep(time.Second)
		}
		st := s.Stats().Models["m"]
		require.Equal(t, int64(120), st.Admitted) // 50 + 50 + 20: TPM binds in the third second
		// TPM is checked before RPS, so it names the third second's refusals.
		require.Equal(t, int64(150+150), st.RateLimited[ReasonRPS])
		require.Equal(t, int64(180), st.RateLimited[ReasonTPM])
		for r, v := range st.Overruns {
			require.Zero(t, v, "overrun of %s", r)
		}
	})
}

func TestRefereeFlagsOverrun(t *testing.T) {
	var l eventLog
	for i := range 3 {
		l.push(int64(i), 10)
	}
	over := overruns(&l, ModelConfig{RPM: 2, TPM: 30, RPS: 3, TPS: 29}, 3)
	require.Equal(t, [4]bool{true, false, false, true}, over)
}

func TestSeriesIsBounded(t *testing.T) {
	var c counters
	c.bucket(0).Requests++
	c.bucket(2*maxSeries*second).Requests++
	require.LessOrEqual(t, len(c.series), maxSeries+1)
	require.Equal(t, int64(1), c.series[len(c.series)-1].Requests)
	require.Equal(t, int64(2*maxSeries), c.series[len(c.series)-1].Unix)
}

func TestSlidingMinute(t *testing.T) {
	series := []Second{{Unix: 100, Requests: 3, Tokens: 30}, {Unix: 130, Requests: 4, Tokens: 10}, {Unix: 159, Requests: 1, Tokens: 5},
		{Unix: 160, Requests: 2, Tokens: 50}, {Unix: 230, Requests: 9, Tokens: 1}}
	tokens, requests := SlidingMinute(series)
	require.Equal(t, int64(65), tokens)  // 130..189: 10+5+50
	require.Equal(t, int64(9), requests) // 100..159 has 8; 230 alone has 9
}
