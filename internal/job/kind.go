package job

import (
	"encoding/json"
	"fmt"
	"math"
)

// Kind is what a job asks of its model (docs/design.md#kinds): each kind has
// its own request body, provider endpoint and admission units, and a model
// serves one kind (config models.<m>.kind).
type Kind string

const (
	// KindChat is an OpenAI chat-completions call (the default).
	KindChat Kind = "chat"
	// KindEmbeddings is an OpenAI embeddings call: input tokens only.
	KindEmbeddings Kind = "embeddings"
	// KindTask is an asynchronous generation task (DashScope image or
	// video): submitted, then polled by its task id.
	KindTask Kind = "task"
	// KindAudio is a speech call limited by audio seconds.
	KindAudio Kind = "audio"
)

// Kinds lists every kind.
var Kinds = []Kind{KindChat, KindEmbeddings, KindTask, KindAudio}

// Valid reports whether k names a kind.
func (k Kind) Valid() bool {
	switch k {
	case KindChat, KindEmbeddings, KindTask, KindAudio:
		return true
	}
	return false
}

// KindOf is k with the default applied: "" is chat.
func KindOf(k Kind) Kind {
	if k == "" {
		return KindChat
	}
	return k
}

// validateKindRequest checks what the request body of a kind other than
// chat must hold; chat's rules are validateRequest's.
func validateKindRequest(k Kind, raw json.RawMessage, lim Limits) error {
	if len(raw) == 0 || firstByte(raw) == 'n' {
		return invalid("request", "is required")
	}
	if firstByte(raw) != '{' {
		return invalid("request", "must be an object (the body of the %s call)", k)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return invalid("request", "malformed: %v", err)
	}
	switch k {
	case KindEmbeddings:
		if err := validateEmbeddingsInput(fields["input"]); err != nil {
			return err
		}
	case KindAudio:
		if _, err := audioDuration(fields["duration_seconds"]); err != nil {
			return err
		}
	case KindTask:
		// DashScope's native body: the task's input (prompt, images, …).
		if firstByte(fields["input"]) != '{' {
			return invalid("request.input", "must be an object (the task's input, e.g. {\"prompt\": …})")
		}
	}
	return checkRequestFields(fields, lim.requestFields())
}

// validateEmbeddingsInput checks an embeddings body's input: a non-empty
// string or a non-empty array (of strings, or of token arrays).
func validateEmbeddingsInput(raw json.RawMessage) error {
	switch firstByte(raw) {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil || s == "" {
			return invalid("request.input", "must be a non-empty string or array")
		}
		return nil
	case '[':
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil || len(items) == 0 {
			return invalid("request.input", "must be a non-empty string or array")
		}
		for i, it := range items {
			if b := firstByte(it); b != '"' && b != '[' && !(b >= '0' && b <= '9') {
				return invalid(fmt.Sprintf("request.input[%d]", i), "must be a string, a token id or an array of token ids")
			}
		}
		return nil
	case 0:
		return invalid("request.input", "is required for an embeddings job")
	}
	return invalid("request.input", "must be a non-empty string or array")
}

// maxAudioSeconds bounds one audio job's declared duration (four hours).
const maxAudioSeconds = 4 * 3600

// audioDuration reads an audio request's duration_seconds: the audio's
// length, which its admission books before the call (docs/design.md#kinds).
func audioDuration(raw json.RawMessage) (float64, error) {
	if len(raw) == 0 || firstByte(raw) == 'n' {
		return 0, invalid("request.duration_seconds", "is required for an audio job (the audio's length in seconds)")
	}
	var d float64
	if json.Unmarshal(raw, &d) != nil || !(d > 0) || d > maxAudioSeconds {
		return 0, invalid("request.duration_seconds", "must be a number above 0 and at most %d", maxAudioSeconds)
	}
	return d, nil
}

// AudioSeconds is the audio duration an audio job declares, rounded up to
// whole seconds as providers bill it (at least 1); 0 for another kind or a
// request without a valid duration.
func (j *Job) AudioSeconds() int {
	if KindOf(j.Kind) != KindAudio {
		return 0
	}
	var req struct {
		Duration json.RawMessage `json:"duration_seconds"`
	}
	if json.Unmarshal(j.Request, &req) != nil {
		return 0
	}
	d, err := audioDuration(req.Duration)
	if err != nil {
		return 0
	}
	return max(1, int(math.Ceil(d)))
}
