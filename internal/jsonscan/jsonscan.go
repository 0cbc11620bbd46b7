// Package jsonscan walks JSON the decoder has already accepted (a
// json.RawMessage of a decoded job, a jsonb column) without decoding it
// again: the members of an object, the elements of an array, a string's
// text. The intake reads a few fields of every request several times
// (validation, capabilities, the output cap, the token estimate); each
// json.Unmarshal of the whole body scanned it twice, to check it and to
// decode it. The walkers here visit it once and allocate only the keys.
//
// They expect valid JSON. On input that is not (or not of the expected
// shape) they report false and never panic or loop; callers fall back to
// encoding/json for their error messages.
package jsonscan

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// Members calls fn with each member of the object obj, in order: its key,
// decoded, and its value as raw bytes. It stops early when fn returns
// false. It reports whether obj is an object it could walk to its end (or
// to where fn stopped).
func Members(obj []byte, fn func(key string, value []byte) bool) bool {
	return MemberBytes(obj, func(key, value []byte) bool { return fn(string(key), value) })
}

// MemberBytes is Members with each key as bytes, which fn must not keep:
// the key's text within obj when it has no escape and is valid UTF-8,
// decoded otherwise. It allocates nothing for such keys.
func MemberBytes(obj []byte, fn func(key, value []byte) bool) bool {
	return walk(obj, '{', '}', func(i int) (int, bool) {
		if obj[i] != '"' {
			return -1, false
		}
		kEnd, escaped := stringEnd(obj, i)
		if kEnd < 0 {
			return -1, false
		}
		key := obj[i+1 : kEnd-1]
		if escaped || !utf8.Valid(key) {
			var s string
			if json.Unmarshal(obj[i:kEnd], &s) != nil {
				return -1, false
			}
			key = []byte(s)
		}
		i = SkipSpace(obj, kEnd)
		if i >= len(obj) || obj[i] != ':' {
			return -1, false
		}
		i = SkipSpace(obj, i+1)
		vEnd := ValueEnd(obj, i)
		if vEnd < 0 {
			return -1, false
		}
		return vEnd, fn(key, obj[i:vEnd])
	})
}

// Pick reads the members of obj that keys name into vals, vals[i] for
// keys[i]: a key named twice leaves its last value, as a decoder does, and
// one obj lacks leaves its val as it was. It reports what Members does.
// It compares the keys as bytes (MemberBytes), so reading a member
// allocates nothing.
func Pick(obj []byte, keys []string, vals ...*[]byte) bool {
	return MemberBytes(obj, func(k, v []byte) bool {
		for i, key := range keys {
			if string(k) == key {
				*vals[i] = v
				break
			}
		}
		return true
	})
}

// Elements calls fn with each element of the array arr, in order, as raw
// bytes, and stops early when fn returns false. It reports whether arr is
// an array it could walk to its end (or to where fn stopped).
func Elements(arr []byte, fn func(elem []byte) bool) bool {
	return walk(arr, '[', ']', func(i int) (int, bool) {
		end := ValueEnd(arr, i)
		if end < 0 {
			return -1, false
		}
		return end, fn(arr[i:end])
	})
}

// walk reads the list that opens with open at the start of b (after
// space), its items separated by commas, up to close: item reads the item
// at b[i] and returns the offset just past it (-1: malformed) and whether
// to go on. It reports whether b is such a list it could walk to its end,
// or to where item stopped.
func walk(b []byte, open, close byte, item func(i int) (end int, more bool)) bool {
	i := SkipSpace(b, 0)
	if i >= len(b) || b[i] != open {
		return false
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == close {
		return true
	}
	for i < len(b) {
		end, more := item(i)
		if end < 0 {
			return false
		}
		if !more {
			return true
		}
		i = SkipSpace(b, end)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case close:
			return true
		case ',':
			i = SkipSpace(b, i+1)
		default:
			return false
		}
	}
	return false
}

// String returns the text of the JSON string raw (surrounding space
// allowed), and false when raw is not a string.
func String(raw []byte) (string, bool) {
	i := SkipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '"' {
		return "", false
	}
	end, escaped := stringEnd(raw, i)
	if end < 0 || SkipSpace(raw, end) != len(raw) {
		return "", false
	}
	// The decoder turns escapes and invalid UTF-8 (to U+FFFD) into text.
	if !escaped && utf8.Valid(raw[i+1:end-1]) {
		return string(raw[i+1 : end-1]), true
	}
	var s string
	if json.Unmarshal(raw[i:end], &s) != nil {
		return "", false
	}
	return s, true
}

// Kind is the first byte of raw's value after space: '{', '[', '"', 't',
// 'f', 'n', a digit or '-'; 0 when raw is empty or blank.
func Kind(raw []byte) byte {
	if i := SkipSpace(raw, 0); i < len(raw) {
		return raw[i]
	}
	return 0
}

// SkipSpace returns the offset of the first byte at or after i that is not
// JSON white space.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the offset just past the string that opens at b[i],
// and whether it holds an escape; -1 when it does not close.
func stringEnd(b []byte, i int) (int, bool) {
	// bytes.IndexByte is vectorised: a chat message's text is most of a
	// request, and a byte loop over it was the consumer's largest leaf.
	// Each byte is looked at about once: the next quote found is kept
	// until an escape skips over it.
	escaped := false
	q := -1 // the next quote at or after j, once found
	for j := i + 1; j < len(b); {
		if q < j {
			if q = bytes.IndexByte(b[j:], '"'); q < 0 {
				return -1, escaped
			}
			q += j
		}
		k := bytes.IndexByte(b[j:q], '\\')
		if k < 0 {
			return q + 1, escaped
		}
		// The byte after a backslash is escaped, a quote too.
		escaped = true
		j += k + 2
	}
	return -1, escaped
}

// valueEnd returns the offset just past the value that starts at b[i], or
// -1 when it does not end.
func ValueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		end, _ := stringEnd(b, i)
		return end
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, _ := stringEnd(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	case ',', '}', ']', ':':
		return -1
	}
	j := i
	for j < len(b) {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
		j++
	}
	return j
}
