package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Decode parses one job message strictly: the payload must be valid UTF-8
// JSON under the size limit, with no unknown fields and no trailing data.
// It does not apply defaults or validate; see Normalize and Validate.
func Decode(data []byte, lim Limits) (Job, error) {
	lim = lim.WithDefaults()
	var j Job
	if len(data) > lim.MaxPayloadBytes {
		return j, invalid("", "payload is %d bytes, over the %d byte limit", len(data), lim.MaxPayloadBytes)
	}
	if !utf8.Valid(data) {
		return j, invalid("", "payload is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return Job{}, decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Job{}, invalid("", "payload has data after the job object")
	}
	// encoding/json matches keys case-insensitively ("ID" fills ID): the
	// contract's names are exact, as the JSON Schema says.
	if key := firstUnknownKey(data, jobFields); key != "" {
		return Job{}, invalid(key, "unknown field (field names are case-sensitive)")
	}
	return j, nil
}

// jobFields are the JSON names of Job's fields.
var jobFields = map[string]bool{"id": true, "tenant": true, "model": true, "kind": true, "fallback_models": true,
	"priority": true, "request": true, "max_attempts": true, "deadline": true, "metadata": true,
	"reply_to": true, "correlation_id": true, "callback_url": true, "result_topic": true}

// firstUnknownKey returns the first key of the JSON object obj that known
// does not list, or "" (also when obj is not an object). obj has passed
// the decoder already, so it is valid JSON: the scan tracks only strings
// and nesting to find the object's own keys and decodes no value (the
// decoder's token walk was nearly half the cost of parsing a job,
// BenchmarkParse). A key written with escapes is left to the decoder,
// which unescapes it.
func firstUnknownKey(obj []byte, known map[string]bool) string {
	i := 0
	for i < len(obj) && (obj[i] == ' ' || obj[i] == '\t' || obj[i] == '\n' || obj[i] == '\r') {
		i++
	}
	if i >= len(obj) || obj[i] != '{' {
		return ""
	}
	depth, wantKey := 0, false
	for ; i < len(obj); i++ {
		switch c := obj[i]; c {
		case '{', '[':
			depth++
			wantKey = c == '{' && depth == 1
		case '}', ']':
			depth--
			if depth == 0 {
				return ""
			}
		case ',':
			wantKey = depth == 1
		case '"':
			end, escaped := i+1, false
			for ; end < len(obj) && obj[end] != '"'; end++ {
				if obj[end] == '\\' {
					escaped = true
					end++
				}
			}
			if wantKey {
				if escaped {
					return firstUnknownKeyDecoded(obj, known)
				}
				if key := obj[i+1 : end]; !known[string(key)] {
					return string(key)
				}
				wantKey = false
			}
			i = end
		}
	}
	return ""
}

// firstUnknownKeyDecoded is firstUnknownKey through the decoder's tokens.
func firstUnknownKeyDecoded(obj []byte, known map[string]bool) string {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return ""
		}
		key, _ := t.(string)
		if !known[key] {
			return key
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}

func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	var timeErr *time.ParseError
	switch {
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return invalid("", "payload must be a JSON object")
		}
		return invalid(field, "must be %s, got JSON %s", jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
	case errors.As(err, &syntaxErr):
		return invalid("", "malformed JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case errors.As(err, &timeErr), strings.Contains(err.Error(), "Time.UnmarshalJSON"):
		return invalid("deadline", "must be an RFC 3339 time such as 2026-12-01T10:00:00Z")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return invalid(strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`), "unknown field")
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("", "payload is empty or truncated JSON")
	default:
		return invalid("", "malformed JSON: %v", err)
	}
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "int", "int64":
		return "an integer"
	case "slice":
		return "an array"
	case "ptr", "struct":
		return "an object"
	case "map":
		return "an object"
	}
	return goKind
}
