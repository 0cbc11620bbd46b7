package config

import (
	"fmt"

	"github.com/llmq/llmq/internal/job"
)

// KindOf returns the kind model serves (models.<m>.kind, default chat). A
// model missing from models: is taken to serve any kind: llmq runs with no
// models configured, and then nothing is checked.
func (m Model) KindOf() job.Kind { return job.KindOf(job.Kind(m.Kind)) }

// Metered is m as its governor and its shared quota see it: an audio
// model is metered in audio seconds, which take the place of tokens (TPM
// is its audio_seconds_per_minute), since one governor meters requests and
// one unit (docs/design.md#kinds). Other models are unchanged.
func (m Model) Metered() Model {
	if m.KindOf() == job.KindAudio {
		m.TPM, m.TPS = m.AudioSecondsPerMinute, 0
	}
	return m
}

// DefaultTaskEndpoint is where a task model submits when it names none.
const DefaultTaskEndpoint = "text2image/image-synthesis"

// TaskEndpointOf is the model's task endpoint (TaskEndpoint, else the default).
func (m Model) TaskEndpointOf() string {
	if m.TaskEndpoint == "" {
		return DefaultTaskEndpoint
	}
	return m.TaskEndpoint
}

// validateModelKind checks models.<name>.kind and that its fallback chain
// stays within that kind: an embeddings job never falls back to a chat
// model (docs/design.md#kinds).
func (c Config) validateModelKind(name string) error {
	m := c.Models[name]
	key := "models." + name
	if !job.Kind(m.Kind).Valid() && m.Kind != "" {
		return badKey(key+".kind", "must be one of chat, embeddings, task, audio; got %q", m.Kind)
	}
	switch {
	case m.AudioSecondsPerMinute < 0:
		return badKey(key+".audio_seconds_per_minute", "must not be negative")
	case m.AudioSecondsPerMinute > 0 && m.KindOf() != job.KindAudio:
		return badKey(key+".audio_seconds_per_minute", "only an audio model (kind: audio) has it")
	case m.TaskEndpoint != "" && m.KindOf() != job.KindTask:
		return badKey(key+".task_endpoint", "only a task model (kind: task) has it")
	case m.KindOf() == job.KindTask && (m.TPM > 0 || m.TPS > 0):
		return badKey(key, "a task model is limited by submissions (rpm, rps) and running tasks (max_concurrency), not tokens")
	case m.KindOf() == job.KindAudio && (m.TPM > 0 || m.TPS > 0):
		return badKey(key, "an audio model is metered in audio seconds, not tokens: set audio_seconds_per_minute, not tpm or tps")
	case m.Batch.Enabled && m.KindOf() != job.KindChat:
		// The batch file's lines call /v1/chat/completions (internal/offload).
		return badKey(key+".batch", "only a chat model can offload to the Batch API; this one serves %s jobs", m.KindOf())
	}
	for _, f := range m.Fallback {
		if fk := c.Models[f].KindOf(); fk != m.KindOf() {
			return badKey(key+".fallback", "names %q, which serves %s jobs, not %s", f, fk, m.KindOf())
		}
	}
	return nil
}

// CheckJobModels refuses a job that names a model models: does not list
// (when it lists any) or a model that does not serve the job's kind, as a
// *job.ValidationError naming the field. The producer and the ingester
// both apply it, so such a job is refused where it is submitted instead of
// failing on a consumer. j is normalised.
func CheckJobModels(models map[string]Model, j *job.Job) error {
	if len(models) == 0 {
		return nil
	}
	check := func(field, name string) error {
		m, ok := models[name]
		if !ok {
			return &job.ValidationError{Field: field, Rule: fmt.Sprintf("%q is not a configured model", name)}
		}
		if k := job.KindOf(j.Kind); m.KindOf() != k {
			return &job.ValidationError{Field: field, Rule: fmt.Sprintf("%q serves %s jobs, not %s jobs (set kind, or pick a model of kind %s)",
				name, m.KindOf(), k, k)}
		}
		return nil
	}
	if err := check("model", j.Model); err != nil {
		return err
	}
	for i, m := range j.FallbackModels {
		if err := check(fmt.Sprintf("fallback_models[%d]", i), m); err != nil {
			return err
		}
	}
	return nil
}
