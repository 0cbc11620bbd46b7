package sim

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// Audio is charged in whole seconds against audio_seconds_per_minute:
// with a limit of 100, two 40.2 s files (41 s each) pass and a third is
// refused with the quota code; RPM refuses with the request code.
func TestAudioChargesSecondsPerMinute(t *testing.T) {
	s := newSim(t, Config{Models: map[string]ModelConfig{
		"asr":  {Kind: KindAudio, AudioSecondsPerMinute: 100, RPM: 3},
		"chat": {},
	}})
	body := `{"model":"asr","duration_seconds":40.2,"language":"en"}`
	for range 2 {
		rec := postTo(s, "/v1/audio/transcriptions", body)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var out struct {
			Text     string  `json:"text"`
			Duration float64 `json:"duration"`
			Usage    struct {
				Type    string `json:"type"`
				Seconds int64  `json:"seconds"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
		require.NotEmpty(t, out.Text)
		require.Equal(t, 40.2, out.Duration)
		require.Equal(t, "duration", out.Usage.Type)
		require.EqualValues(t, 41, out.Usage.Seconds)
	}
	requireCode(t, postTo(s, "/v1/audio/transcriptions", body), http.StatusTooManyRequests, "insufficient_quota")
	// 18 more seconds fit (82 + 18 = 100), and use up the third request.
	require.Equal(t, http.StatusOK, postTo(s, "/v1/audio/transcriptions", `{"model":"asr","duration_seconds":18}`).Code)
	requireCode(t, postTo(s, "/v1/audio/transcriptions", `{"model":"asr","duration_seconds":0.5}`), http.StatusTooManyRequests, "limit_requests")

	st := s.Stats().Models["asr"]
	require.EqualValues(t, 100, st.InputTokens, "the event log counts audio seconds")
	require.EqualValues(t, 1, st.RateLimited[ReasonAudioSeconds])
	require.EqualValues(t, 1, st.RateLimited[ReasonRPM])
	require.Contains(t, st.Overruns, ReasonAudioSeconds)
	require.NotContains(t, st.Overruns, ReasonTPM)
	for r, n := range st.Overruns {
		require.Zero(t, n, r)
	}

	requireCode(t, postTo(s, "/v1/audio/transcriptions", `{"model":"chat","duration_seconds":1}`), http.StatusBadRequest, "model_not_supported")
	requireCode(t, postTo(s, "/v1/audio/transcriptions", `{"model":"asr"}`), http.StatusBadRequest, "invalid_parameter_error")
	requireCode(t, postTo(s, "/v1/audio/transcriptions", `{"model":"asr","duration_seconds":200}`), http.StatusBadRequest, "invalid_parameter_error")
}

func TestAudioDashScopeCode(t *testing.T) {
	s := newSim(t, Config{Dialect: DialectDashScope, Models: map[string]ModelConfig{"asr": {Kind: KindAudio, AudioSecondsPerMinute: 10}}})
	require.Equal(t, http.StatusOK, postTo(s, "/v1/audio/transcriptions", `{"model":"asr","duration_seconds":10}`).Code)
	rec := postTo(s, "/v1/audio/transcriptions", `{"model":"asr","duration_seconds":1}`)
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	var body struct{ Code, Message string }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Equal(t, "Throttling.AllocationQuota", body.Code)
	require.Contains(t, body.Message, "audio seconds limit 10 per 60s")
}

func TestAudioConfigIsChecked(t *testing.T) {
	for _, m := range []ModelConfig{
		{Kind: KindAudio, TPM: 10},
		{AudioSecondsPerMinute: 10},
		{Kind: KindAudio, AudioSecondsPerMinute: -1},
	} {
		require.Error(t, m.Validate(), "%+v", m)
	}
	require.NoError(t, ModelConfig{Kind: KindAudio, AudioSecondsPerMinute: 10, RPM: 5}.Validate())
}
