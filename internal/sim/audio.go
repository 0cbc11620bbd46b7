package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
)

// maxAudioSeconds bounds one request's audio (four hours).
const maxAudioSeconds = 4 * 3600

// audioRequest is the simulator's transcription request: JSON, not the
// multipart upload of a real provider, since the simulator needs only the
// audio's length. duration_seconds is that length; the simulator charges
// it rounded up to whole seconds, as providers bill.
//
//	{"model": "paraformer-v2", "duration_seconds": 42.5, "language": "en"}
type audioRequest struct {
	Model    string   `json:"model"`
	Duration *float64 `json:"duration_seconds"`
}

// AudioSeconds is what the simulator charges for a transcription of d
// seconds: whole seconds, at least 1.
func AudioSeconds(d float64) int64 { return max(1, int64(math.Ceil(d))) }

// validateAudio checks the limits of an audio model: audio seconds in the
// place of tokens.
func (m ModelConfig) validateAudio(key string) error {
	if m.AudioSecondsPerMinute < 0 {
		return fmt.Errorf("%s.audio_seconds_per_minute: negative (%d)", key, m.AudioSecondsPerMinute)
	}
	if m.Kind != KindAudio && m.AudioSecondsPerMinute != 0 {
		return fmt.Errorf("%s.audio_seconds_per_minute: only an audio model has it (kind: audio)", key)
	}
	if m.Kind == KindAudio && (m.TPM != 0 || m.TPS != 0 || m.Burst.TokenFloor != 0) {
		return fmt.Errorf("%s: an audio model has no token limits (tpm, tps, burst.token_floor): use audio_seconds_per_minute", key)
	}
	return nil
}

// handleAudio serves /audio/transcriptions: admitted against the model's
// RPM and RPS and its audio seconds per minute, refused with the dialect's
// 429 codes like a chat call (the audio limit answers as the token one
// does: insufficient_quota, Throttling.AllocationQuota), and answered
// with a transcript and the seconds billed as usage.
func (s *Simulator) handleAudio(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req audioRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error", "request body is not a valid transcription request: "+err.Error())
		return
	}
	if req.Duration == nil || !(*req.Duration > 0) || *req.Duration > maxAudioSeconds {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error",
			fmt.Sprintf("duration_seconds must be a number above 0 and at most %d", maxAudioSeconds))
		return
	}
	md := s.modelOfKind(w, req.Model, KindAudio)
	if md == nil {
		return
	}
	id := fmt.Sprintf("asr-sim%012x", s.ids.Add(1))
	w.Header().Set("x-request-id", id)
	secs := AudioSeconds(*req.Duration)
	if !s.admitUnary(w, r, md, req.Model, id, secs) {
		return
	}
	defer md.done()
	writeJSON(w, http.StatusOK, map[string]any{
		"text":     fmt.Sprintf("[transcript of %g s of audio, %s]", *req.Duration, id),
		"duration": *req.Duration,
		"usage":    map[string]any{"type": "duration", "seconds": secs},
	})
}
