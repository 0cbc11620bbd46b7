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
	"encoding/json"
	"unicode/utf8"
)

// Members calls fn with each member of the object obj, in order: its key,
// decoded, and its value as raw bytes. It stops early when fn returns
// false. It reports whether obj is an object it could walk to its end (or
// to where fn stopped).
func Members(obj []byte, fn func(key string, value []byte) bool) bool {
	i := SkipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	i = SkipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return true
	}
	for i < len(obj) {
		if obj[i] != '"' {
			return false
		}
		kEnd, escaped := stringEnd(obj, i)
		if kEnd < 0 {
			return false
		}
		var key string
		if escaped || !utf8.Valid(obj[i+1:kEnd-1]) {
			if json.Unmarshal(obj[i:kEnd], &key) != nil {
				return false
			}
		} else {
			key = string(obj[i+1 : kEnd-1])
		}
		i = SkipSpace(obj, kEnd)
		if i >= len(obj) || obj[i] != ':' {
			return false
		}
		i = SkipSpace(obj, i+1)
		vEnd := ValueEnd(obj, i)
		if vEnd < 0 {
			return false
		}
		if !fn(key, obj[i:vEnd]) {
			return true
		}
		i = SkipSpace(obj, vEnd)
		if i >= len(obj) {
			return false
		}
		switch obj[i] {
		case '}':
			return true
		case ',':
			i = SkipSpace(obj, i+1)
		default:
			return false
		}
	}
	return false
}

// Elements calls fn with each element of the array arr, in order, as raw
// bytes, and stops early when fn returns false. It reports whether arr is
// an array it could walk to its end (or to where fn stopped).
func Elements(arr []byte, fn func(elem []byte) bool) bool {
	i := SkipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return false
	}
	i = SkipSpace(arr, i+1)
	if i < len(arr) && arr[i] == ']' {
		return true
	}
	for i < len(arr) {
		end := ValueEnd(arr, i)
		if end < 0 {
			return false
		}
		if !fn(arr[i:end]) {
			return true
		}
		i = SkipSpace(arr, end)
		if i >= len(arr) {
			return false
		}
		switch arr[i] {
		case ']':
			return true
		case ',':
			i = SkipSpace(arr, i+1)
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
	escaped := false
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
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
