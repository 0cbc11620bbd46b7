package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/llmq/llmq/internal/jsonscan"
)

// SetTopLevel returns body with the top-level key set to the JSON value raw:
// an existing key's value is replaced in place, a missing key is inserted
// right after the opening brace. Every other byte of the body is kept as
// it was (key order, spacing, number formatting), so the provider receives
// the producer's request as written.
func SetTopLevel(body []byte, key string, raw []byte) ([]byte, error) {
	start, end, found, open, err := findTopLevel(body, key)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(body)+len(key)+len(raw)+8)
	if found {
		out = append(out, body[:start]...)
		out = append(out, raw...)
		return append(out, body[end:]...), nil
	}
	k, _ := json.Marshal(key)
	out = append(out, body[:open+1]...)
	out = append(out, k...)
	out = append(out, ':')
	out = append(out, raw...)
	rest := body[open+1:]
	if t := bytes.TrimLeft(rest, " \t\r\n"); len(t) > 0 && t[0] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...), nil
}

var errNotObject = errors.New("request must be a JSON object")

// findTopLevel locates the value of key in the top-level object of body.
// It returns the value's byte span, whether it was found, and the offset of
// the object's opening brace.
func findTopLevel(body []byte, key string) (start, end int, found bool, open int, err error) {
	i := jsonscan.SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, 0, false, 0, errNotObject
	}
	open = i
	i++
	for {
		i = jsonscan.SkipSpace(body, i)
		if i >= len(body) {
			return 0, 0, false, 0, errNotObject
		}
		switch body[i] {
		case '}':
			return 0, 0, false, open, nil
		case ',':
			i++
			continue
		case '"':
		default:
			return 0, 0, false, 0, fmt.Errorf("request: unexpected byte %q at %d", body[i], i)
		}
		kEnd := jsonscan.ValueEnd(body, i)
		if kEnd < 0 {
			return 0, 0, false, 0, errors.New("request: unterminated string")
		}
		name, ok := jsonscan.String(body[i:kEnd])
		if !ok {
			return 0, 0, false, 0, fmt.Errorf("request: bad key at %d", i)
		}
		i = jsonscan.SkipSpace(body, kEnd)
		if i >= len(body) || body[i] != ':' {
			return 0, 0, false, 0, errNotObject
		}
		i = jsonscan.SkipSpace(body, i+1)
		vEnd := jsonscan.ValueEnd(body, i)
		if vEnd < 0 {
			return 0, 0, false, 0, fmt.Errorf("request: malformed value at %d", i)
		}
		if name == key {
			return i, vEnd, true, open, nil
		}
		i = vEnd
	}
}
