package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, 0, false, 0, errNotObject
	}
	open = i
	i++
	for {
		i = skipWS(body, i)
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
		kEnd, err := skipString(body, i)
		if err != nil {
			return 0, 0, false, 0, err
		}
		var name string
		if err := json.Unmarshal(body[i:kEnd], &name); err != nil {
			return 0, 0, false, 0, fmt.Errorf("request: bad key: %w", err)
		}
		i = skipWS(body, kEnd)
		if i >= len(body) || body[i] != ':' {
			return 0, 0, false, 0, errNotObject
		}
		i = skipWS(body, i+1)
		vEnd, err := skipValue(body, i)
		if err != nil {
			return 0, 0, false, 0, err
		}
		if name == key {
			return i, vEnd, true, open, nil
		}
		i = vEnd
	}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the offset just past the string starting at b[i] == '"'.
func skipString(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, errors.New("request: unterminated string")
}

// skipValue returns the offset just past the JSON value starting at b[i].
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errors.New("request: missing value")
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e, err := skipString(b, j)
				if err != nil {
					return 0, err
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, errors.New("request: unterminated value")
	default:
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' && b[j] != '\t' && b[j] != '\r' {
			j++
		}
		if j == i {
			return 0, fmt.Errorf("request: unexpected byte %q at %d", b[i], i)
		}
		return j, nil
	}
}
