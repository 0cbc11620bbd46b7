package sim

import (
	"fmt"
	"time"
)

// Reason names the limit behind a 429.
type Reason string

// Reasons, in the order they are checked.
const (
	ReasonRPM   Reason = "rpm"
	ReasonTPM   Reason = "tpm"
	ReasonRPS   Reason = "rps"
	ReasonTPS   Reason = "tps"
	ReasonBurst Reason = "burst"
	// ReasonAudioSeconds is an audio model's audio seconds per minute,
	// which it has in place of TPM (audio.go).
	ReasonAudioSeconds Reason = "audio_seconds"
	// ReasonRunningTasks is a task model's limit of unfinished tasks.
	ReasonRunningTasks Reason = "running_tasks"
)

// Reasons lists every Reason in check order.
var Reasons = []Reason{ReasonRPM, ReasonTPM, ReasonRPS, ReasonTPS, ReasonBurst, ReasonAudioSeconds, ReasonRunningTasks}

const (
	minute = int64(time.Minute)
	second = int64(time.Second)
)

// decision is the outcome of checking one request against a model's limits.
type decision struct {
	reason Reason        // "" when admitted
	wait   time.Duration // until the refused request would fit
	limit  int64         // the limit that refused it (threshold, for burst)
}

// quota is one absolute sliding-window limit.
type quota struct {
	reason Reason
	window int64
	limit  int64
	tokens bool
}

// quotas are the model's absolute limits. An audio model's metered unit
// (its "tokens" in the event log) is audio seconds, limited per minute in
// the place of TPM.
func (m ModelConfig) quotas() [4]quota {
	units := quota{ReasonTPM, minute, m.TPM, true}
	if m.Kind == KindAudio {
		units = quota{ReasonAudioSeconds, minute, m.AudioSecondsPerMinute, true}
	}
	return [4]quota{
		{ReasonRPM, minute, m.RPM, false},
		units,
		{ReasonRPS, second, m.RPS, false},
		{ReasonTPS, second, m.TPS, true},
	}
}

// horizon is how much history the model's rules read.
func (m ModelConfig) horizon() int64 {
	h := minute
	if m.Burst.enabled() {
		h = max(h, second+int64(m.Burst.Window))
	}
	return h
}

// tooLarge reports a request that no window could ever admit: its tokens
// alone exceed the TPM or TPS limit.
func (m ModelConfig) tooLarge(tokens int64) error {
	if m.Kind == KindAudio && m.AudioSecondsPerMinute > 0 && tokens > m.AudioSecondsPerMinute {
		return fmt.Errorf("request has %d audio seconds, more than the model's audio_seconds_per_minute limit of %d", tokens, m.AudioSecondsPerMinute)
	}
	if m.TPM > 0 && tokens > m.TPM {
		return fmt.Errorf("request needs %d tokens, more than the model's tpm limit of %d", tokens, m.TPM)
	}
	if m.TPS > 0 && tokens > m.TPS {
		return fmt.Errorf("request needs %d tokens, more than the model's tps limit of %d", tokens, m.TPS)
	}
	return nil
}

// check decides whether a request of the given tokens is admitted at now:
// RPM, TPM, RPS, TPS, then the burst rule; the first that refuses names the
// reason. It does not record anything.
func check(l *eventLog, m ModelConfig, now, tokens int64) decision {
	for _, q := range m.quotas() {
		if q.limit <= 0 {
			continue
		}
		var ok bool
		var wait int64
		if q.tokens {
			ok, wait = l.tokenWait(now, q.window, q.limit, tokens)
		} else {
			ok, wait = l.requestWait(now, q.window, q.limit)
		}
		if !ok {
			return decision{reason: q.reason, wait: time.Duration(wait), limit: q.limit}
		}
	}
	if m.Burst.enabled() {
		if ok, wait, thr := m.Burst.check(l, now, tokens); !ok {
			return decision{reason: ReasonBurst, wait: time.Duration(wait), limit: thr}
		}
	}
	return decision{}
}

// overruns counts, per absolute limit, whether the admitted traffic in the
// window ending at now exceeds it: the referee's check, 0 unless the
// simulator itself is wrong.
func overruns(l *eventLog, m ModelConfig, now int64) (over [4]bool) {
	for i, q := range m.quotas() {
		if q.limit <= 0 {
			continue
		}
		_, c, tok := l.window(now, q.window)
		if (q.tokens && tok > q.limit) || (!q.tokens && c > q.limit) {
			over[i] = true
		}
	}
	return over
}
