package store

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// appendLogEntry appends e as JSON, as encoding/json encodes it (field
// names, omitempty, RFC 3339 times), without reflection: every completion
// writes one entry, and json.Marshal of it was a thirtieth of the
// consumer's CPU in the side-by-side profile
// (TestLogEntryEncodesAsEncodingJSON).
func appendLogEntry(b []byte, e AttemptLogEntry) []byte {
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, int64(e.Attempt), 10)
	b = appendStringField(b, "model", e.Model, true)
	b = appendStringField(b, "outcome", e.Outcome, false)
	b = appendStringField(b, "kind", e.Kind, true)
	b = appendIntField(b, "http_status", e.HTTPStatus)
	b = appendStringField(b, "code", e.Code, true)
	b = appendStringField(b, "message", e.Message, true)
	if e.ClaimedAt != nil {
		b = appendTimeField(b, "claimed_at", *e.ClaimedAt)
	}
	if e.StartedAt != nil {
		b = appendTimeField(b, "started_at", *e.StartedAt)
	}
	b = appendTimeField(b, "ended_at", e.EndedAt)
	b = appendIntField(b, "prompt_tokens", e.PromptTokens)
	b = appendIntField(b, "completion_tokens", e.CompletionTokens)
	return append(b, '}')
}

func appendStringField(b []byte, name, v string, omitEmpty bool) []byte {
	if omitEmpty && v == "" {
		return b
	}
	return appendJSONString(appendKey(b, name), v)
}

func appendIntField(b []byte, name string, v int) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendInt(appendKey(b, name), int64(v), 10)
}

func appendTimeField(b []byte, name string, t time.Time) []byte {
	b = append(appendKey(b, name), '"')
	return append(t.AppendFormat(b, time.RFC3339Nano), '"')
}

// appendKey appends `,"name":`, a member after the first.
func appendKey(b []byte, name string) []byte {
	return append(append(append(b, ",\""...), name...), "\":"...)
}

// appendJSONString appends s quoted. A string with nothing to escape (the
// models, outcomes and kinds always) goes as it is; any other is left to
// encoding/json, which also makes invalid UTF-8 valid.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= utf8.RuneSelf {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	return append(append(append(b, '"'), s...), '"')
}
