package jsonscan

import "encoding/binary"

// maxDepth is encoding/json's limit on nesting: a value nested deeper is
// not valid to it.
const maxDepth = 10000

// Valid reports whether data is one JSON value, with space around it,
// exactly where encoding/json.Valid does (FuzzValidAgreesWithDecoder):
// the grammar of RFC 8259, strings not checked for UTF-8, nesting up to
// maxDepth. It is the decoder's check made fast where a job spends its
// bytes, in the text of strings, which it skips eight bytes at a time;
// the decoder's state machine looks at every byte through a function
// call, and was half the cost of reading a chat job (BenchmarkValid).
func Valid(data []byte) bool {
	var buf [32]byte
	open := buf[:0] // '{' or '[' of each container not yet closed
	i := SkipSpace(data, 0)
	for {
		// A value starts at i.
		if i >= len(data) {
			return false
		}
		switch c := data[i]; c {
		case '{', '[':
			if len(open) >= maxDepth {
				return false
			}
			i = SkipSpace(data, i+1)
			if i < len(data) && data[i] == closer(c) {
				i++
				break
			}
			open = append(open, c)
			if c == '{' {
				if i = memberValue(data, i); i < 0 {
					return false
				}
			}
			continue
		case '"':
			i = validString(data, i)
		case 't':
			i = literal(data, i, "true")
		case 'f':
			i = literal(data, i, "false")
		case 'n':
			i = literal(data, i, "null")
		default:
			i = number(data, i)
		}
		if i < 0 {
			return false
		}
		// A value ended at i: close the containers it ends, find the next.
		for {
			i = SkipSpace(data, i)
			if len(open) == 0 {
				return i == len(data)
			}
			if i >= len(data) {
				return false
			}
			top := open[len(open)-1]
			c := data[i]
			if c == ',' {
				i = SkipSpace(data, i+1)
				if top == '{' {
					i = memberValue(data, i)
				}
				break
			}
			if c == closer(top) {
				open = open[:len(open)-1]
				i++
				continue
			}
			return false
		}
		if i < 0 {
			return false
		}
	}
}

// closer is the byte that closes the container open opens.
func closer(open byte) byte {
	if open == '[' {
		return ']'
	}
	return '}'
}

// memberValue reads an object member's key and colon at i and returns
// where its value starts, or -1.
func memberValue(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = validString(b, i); i < 0 {
		return -1
	}
	if i = SkipSpace(b, i); i >= len(b) || b[i] != ':' {
		return -1
	}
	return SkipSpace(b, i+1)
}

// validString returns the offset just past the valid string that opens
// at b[i], or -1.
func validString(b []byte, i int) int {
	j := i + 1
	for {
		for j+8 <= len(b) && !special(binary.LittleEndian.Uint64(b[j:])) {
			j += 8
		}
		if j >= len(b) {
			return -1
		}
		switch c := b[j]; {
		case c == '"':
			return j + 1
		case c == '\\':
			if j+1 >= len(b) {
				return -1
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if j+6 > len(b) || !hex4(b[j+2:j+6]) {
					return -1
				}
				j += 6
			default:
				return -1
			}
		case c < 0x20:
			return -1
		default:
			j++
		}
	}
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// special reports whether any of the eight bytes of x is a quote, a
// backslash or a control character (below 0x20): the bytes a string's
// text cannot hold as they are. Each test is the exact "some byte is
// zero" (or "less than n") bit trick on the eight bytes at once.
func special(x uint64) bool {
	q, bs := x^(ones*'"'), x^(ones*'\\')
	return ((q-ones)&^q|(bs-ones)&^bs|(x-ones*0x20)&^x)&highs != 0
}

func hex4(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// literal returns the offset past word at b[i], or -1.
func literal(b []byte, i int, word string) int {
	if len(b)-i < len(word) || string(b[i:i+len(word)]) != word {
		return -1
	}
	return i + len(word)
}

// number returns the offset past the number at b[i]
// (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?), or -1.
func number(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		if i+1 >= len(b) || !isDigit(b[i+1]) {
			return -1
		}
		i = digits(b, i+1)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		i = digits(b, i)
	}
	return i
}

func digits(b []byte, i int) int {
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	return i
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
