package sim

import (
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// spaced sends n requests one gap apart, all of which must pass.
func spaced(t *testing.T, s *Simulator, n int, gap time.Duration) {
	t.Helper()
	for i := range n {
		if i > 0 {
			time.Sleep(gap)
		}
		requireCode(t, hi(s), http.StatusOK, "")
	}
}

func TestLimitsSlidingWindows(t *testing.T) {
	cases := []struct {
		name   string
		model  ModelConfig
		n      int           // requests that fit the window
		gap    time.Duration // between them
		window time.Duration
		code   string
	}{
		{"rpm", ModelConfig{RPM: 5}, 5, 10 * time.Second, time.Minute, "limit_requests"},
		{"tpm", ModelConfig{TPM: 3 * tokensPerHi}, 3, 15 * time.Second, time.Minute, "insufficient_quota"},
		{"rps", ModelConfig{RPS: 4}, 4, 100 * time.Millisecond, time.Second, "limit_requests"},
		{"tps", ModelConfig{TPS: 2 * tokensPerHi}, 2, 300 * time.Millisecond, time.Second, "insufficient_quota"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newSim(t, oneModel(tc.model))
				start := time.Now()
				spaced(t, s, tc.n, tc.gap) // request N passes
				time.Sleep(tc.gap)
				requireCode(t, hi(s), http.StatusTooManyRequests, tc.code) // N+1 does not
				// One nanosecond before the first request leaves the window: still refused.
				time.Sleep(time.Until(start.Add(tc.window)) - time.Nanosecond)
				requireCode(t, hi(s), http.StatusTooManyRequests, tc.code)
				time.Sleep(time.Nanosecond) // the first request has left (now-window, now]
				requireCode(t, hi(s), http.StatusOK, "")
				requireCode(t, hi(s), http.StatusTooManyRequests, tc.code) // and the window is full again
				st := s.Stats().Models["m"]
				require.Equal(t, int64(tc.n+1), st.Admitted)
				require.Equal(t, int64(3), st.RateLimitedTotal)
				for r, v := range st.Overruns {
					require.Zero(t, v, "overrun of %s", r)
				}
			})
		})
	}
}

func TestTokensTooLargeIs400(t *testing.T) {
	s := newSim(t, oneModel(ModelConfig{TPS: tokensPerHi - 1}))
	requireCode(t, hi(s), http.StatusBadRequest, "invalid_parameter_error")
	require.Equal(t, int64(1), s.Stats().Models["m"].TooLarge)
}

func TestBurstDynamicThreshold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSim(t, oneModel(ModelConfig{Burst: BurstConfig{Floor: 2, Growth: 2, Window: Duration(10 * time.Second)}}))
		// From idle only the floor (2/s) is allowed.
		spaced(t, s, 2, 0)
		requireCode(t, hi(s), http.StatusTooManyRequests, "limit_burst_rate")
		// Ten seconds at 2/s raise the threshold to 2 × 2 = 4/s.
		for range 9 {
			time.Sleep(time.Second)
			spaced(t, s, 2, 0)
		}
		time.Sleep(time.Second)
		spaced(t, s, 4, 0)
		requireCode(t, hi(s), http.StatusTooManyRequests, "limit_burst_rate")
		require.Equal(t, int64(2), s.Stats().Models["m"].RateLimited[ReasonBurst])
	})
}

func TestRateLimitDialects(t *testing.T) {
	models := map[Reason]ModelConfig{
		ReasonRPM:   {RPM: 1},
		ReasonRPS:   {RPS: 1},
		ReasonTPM:   {TPM: tokensPerHi},
		ReasonTPS:   {TPS: tokensPerHi},
		ReasonBurst: {Burst: BurstConfig{Floor: 1}},
	}
	want := map[Reason][2]string{
		ReasonRPM:   {"limit_requests", "Throttling.RateQuota"},
		ReasonRPS:   {"limit_requests", "Throttling.RateQuota"},
		ReasonTPM:   {"insufficient_quota", "Throttling.AllocationQuota"},
		ReasonTPS:   {"insufficient_quota", "Throttling.AllocationQuota"},
		ReasonBurst: {"limit_burst_rate", "Throttling.BurstRate"},
	}
	for _, r := range Reasons {
		if r == ReasonAudioSeconds || r == ReasonRunningTasks {
			continue // an audio or task model's limit: audio_test.go, tasks_test.go
		}
		for i, dialect := range []string{DialectOpenAI, DialectDashScope} {
			t.Run(string(r)+"/"+dialect, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					cfg := oneModel(models[r])
					cfg.Dialect = dialect
					cfg.Headers = HeaderConfig{RetryAfter: true, RateLimit: true}
					s := newSim(t, cfg)
					requireCode(t, hi(s), http.StatusOK, "")
					rec := hi(s)
					require.Equal(t, http.StatusTooManyRequests, rec.Code)
					e := decodeErr(t, rec)
					if i == 0 {
						require.Equal(t, want[r][0], e.Error.Code)
						require.Equal(t, want[r][0], e.Error.Type)
						require.NotEmpty(t, e.Error.Message)
					} else {
						require.Equal(t, want[r][1], e.Code)
						require.Equal(t, rec.Header().Get("x-request-id"), e.RequestID)
						require.NotEmpty(t, e.RequestID)
					}
					require.NotEmpty(t, rec.Header().Get("Retry-After"))
					if r == ReasonRPM {
						require.Equal(t, "60", rec.Header().Get("Retry-After"))
						require.Equal(t, "1", rec.Header().Get("x-ratelimit-limit-requests"))
						require.Equal(t, "0", rec.Header().Get("x-ratelimit-remaining-requests"))
						require.Equal(t, "1m0s", rec.Header().Get("x-ratelimit-reset-requests"))
					}
				})
			})
		}
	}
}

func TestRateLimitHeadersOnSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := oneModel(ModelConfig{RPM: 10, TPM: 1000})
		cfg.Headers.RateLimit = true
		s := newSim(t, cfg)
		rec := hi(s)
		requireCode(t, rec, http.StatusOK, "")
		h := rec.Header()
		require.Equal(t, "10", h.Get("x-ratelimit-limit-requests"))
		require.Equal(t, "9", h.Get("x-ratelimit-remaining-requests"))
		require.Equal(t, "1000", h.Get("x-ratelimit-limit-tokens"))
		require.Equal(t, "982", h.Get("x-ratelimit-remaining-tokens"))
		require.Empty(t, h.Get("Retry-After"))
	})
}

func TestHeadersOffByDefault(t *testing.T) {
	s := newSim(t, oneModel(ModelConfig{RPM: 1}))
	requireCode(t, hi(s), http.StatusOK, "")
	rec := hi(s)
	requireCode(t, rec, http.StatusTooManyRequests, "limit_requests")
	require.Empty(t, rec.Header().Get("Retry-After"))
	require.Empty(t, rec.Header().Get("x-ratelimit-limit-requests"))
}

func TestRuntimeLimitChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSim(t, oneModel(ModelConfig{RPM: 3}))
		spaced(t, s, 2, 0)
		// Lowering the limit applies to the traffic already in the window.
		require.NoError(t, s.SetModel("m", ModelConfig{RPM: 2, Output: fixedMix}))
		requireCode(t, hi(s), http.StatusTooManyRequests, "limit_requests")
		// Raising it over the admin endpoint admits more at once.
		rec := put(s, "/admin/models/m", `{"rpm": 4, "output": {"short": 10, "long": 10}}`)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		spaced(t, s, 2, 0)
		requireCode(t, hi(s), http.StatusTooManyRequests, "limit_requests")
		cfg, ok := s.Model("m")
		require.True(t, ok)
		require.Equal(t, int64(4), cfg.RPM)
		// A new model can be added at run time.
		require.Equal(t, http.StatusOK, put(s, "/admin/models/other", `{"tpm": 100, "burst": {"floor": 5, "window": "5s"}}`).Code)
		requireCode(t, post(s, chatBody("other", "hi", "")), http.StatusOK, "")
		// Bad admin bodies name the problem.
		rec = put(s, "/admin/models/m", `{"rpm": -1}`)
		requireCode(t, rec, http.StatusBadRequest, "invalid_parameter_error")
		require.Contains(t, decodeErr(t, rec).Error.Message, "rpm")
		rec = put(s, "/admin/models/m", `{"rpmm": 1}`)
		requireCode(t, rec, http.StatusBadRequest, "invalid_parameter_error")
		require.Contains(t, decodeErr(t, rec).Error.Message, "rpmm")
	})
}

func TestBurstTokenRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Requests are generous; tokens from idle are held to 2 requests' worth per second.
		s := newSim(t, oneModel(ModelConfig{Burst: BurstConfig{Floor: 100, Growth: 2, TokenFloor: 2 * tokensPerHi}}))
		spaced(t, s, 2, 0)
		rec := hi(s, "X-DashScope-Wait-Timeout", "0")
		requireCode(t, rec, http.StatusTooManyRequests, "limit_burst_rate")
		// Queued, it passes once the first second's tokens have left.
		start := time.Now()
		requireCode(t, hi(s, "X-DashScope-Wait-Timeout", "3"), http.StatusOK, "")
		require.Equal(t, time.Second, time.Since(start))
		// A request bigger than the token floor still passes into an empty second.
		time.Sleep(time.Minute)
		requireCode(t, post(s, chatBody("m", strings.Repeat("x", 400), "")), http.StatusOK, "")
	})
}

// With ChargeAtAdmission a call is admitted on its input and charged its
// whole usage at admission: the window can go past the limit by the
// answers of calls admitted while it had room for their input.
func TestChargeAtAdmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		limit := int64(2*tokensPerHi - 1)
		def := newSim(t, oneModel(ModelConfig{TPM: limit}))
		requireCode(t, hi(def), http.StatusOK, "")
		requireCode(t, hi(def), http.StatusTooManyRequests, "insufficient_quota")

		adm := newSim(t, oneModel(ModelConfig{TPM: limit, ChargeAtAdmission: true}))
		requireCode(t, hi(adm), http.StatusOK, "")
		requireCode(t, hi(adm), http.StatusOK, "") // its input fits; its answer takes the window past the limit
		requireCode(t, hi(adm), http.StatusTooManyRequests, "insufficient_quota")
		require.Equal(t, int64(2), adm.Stats().Models["m"].Admitted)
	})
}
