package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmq/llmq/internal/jsonscan"
)

// Decode parses one job message strictly: the payload must be valid UTF-8
// JSON under the size limit, with no unknown fields and no trailing data.
// It does not apply defaults or validate; see Normalize and Validate.
func Decode(data []byte, lim Limits) (Job, error) {
	lim = lim.WithDefaults()
	if len(data) > lim.MaxPayloadBytes {
		return Job{}, invalid("", "payload is %d bytes, over the %d byte limit", len(data), lim.MaxPayloadBytes)
	}
	if !utf8.Valid(data) {
		return Job{}, invalid("", "payload is not valid UTF-8")
	}
	if j, ok := decodeValid(data); ok {
		return j, nil
	}
	return decodeStrict(data)
}

// decodeStrict is Decode through the decoder, for every message the
// one-pass way does not take: its errors are the ones Decode gives.
func decodeStrict(data []byte) (Job, error) {
	var j Job
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

// decodeValid decodes data in one pass when it is a valid JSON object
// whose members all name Job's fields, each once, with a value of its
// field's type: the members are walked once (jsonscan) and only the small
// values decoded, the request and metadata kept as they are. Any other
// input reports false and is left to decodeStrict, whose errors are
// Decode's (FuzzDecodeValidAgreesWithDecoder). The decoder scans the whole
// message twice, the request included, to check it and to decode it
// (BenchmarkParse); jsonscan.Valid checks it first, as json.Valid would, at a
// fifth of the cost.
func decodeValid(data []byte) (Job, bool) {
	if !jsonscan.Valid(data) {
		return Job{}, false
	}
	var j Job
	var seen uint16
	taken := true // Members reports true also where fn stopped it
	walked := jsonscan.Members(data, func(key string, value []byte) bool {
		bit, known := jobFieldBits[key]
		taken = known && seen&bit == 0 && j.setField(key, value)
		seen |= bit
		return taken
	})
	return j, walked && taken
}

// jobFieldBits numbers Job's JSON names, to find a repeated member.
var jobFieldBits = func() map[string]uint16 {
	m := make(map[string]uint16, len(jobFields))
	var bit uint16 = 1
	for name := range jobFields {
		m[name] = bit
		bit <<= 1
	}
	return m
}()

// setField sets the field named key from its raw JSON value as the
// decoder would, and reports false where the decoder would fail or where
// its way is not this one's to copy (a string that is not a JSON string).
func (j *Job) setField(key string, value []byte) bool {
	str := func(dst *string) bool {
		if jsonscan.Kind(value) == 'n' {
			return true // null leaves a string as it is
		}
		s, ok := jsonscan.String(value)
		*dst = s
		return ok
	}
	switch key {
	case "id":
		return str(&j.ID)
	case "tenant":
		return str(&j.Tenant)
	case "model":
		return str(&j.Model)
	case "kind":
		var s string
		ok := str(&s)
		j.Kind = Kind(s)
		return ok
	case "priority":
		var s string
		ok := str(&s)
		j.Priority = Priority(s)
		return ok
	case "reply_to":
		return str(&j.ReplyTo)
	case "correlation_id":
		return str(&j.CorrelationID)
	case "callback_url":
		return str(&j.CallbackURL)
	case "result_topic":
		return str(&j.ResultTopic)
	case "request":
		j.Request = append(json.RawMessage(nil), value...)
		return true
	case "metadata":
		j.Metadata = append(json.RawMessage(nil), value...)
		return true
	case "fallback_models":
		return json.Unmarshal(value, &j.FallbackModels) == nil
	case "max_attempts":
		return json.Unmarshal(value, &j.MaxAttempts) == nil
	case "deadline":
		return json.Unmarshal(value, &j.Deadline) == nil
	}
	return false
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
