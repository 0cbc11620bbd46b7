package job

import "bytes"

// checkNUL refuses a request or metadata that holds the NUL character.
// encoding/json accepts it, as the escape \u0000, and Postgres's jsonb
// refuses it: the insert of a batch that held one such job would fail for
// every job in it, again at each redelivery.
func (j *Job) checkNUL() error {
	if hasNULEscape(j.Request) {
		return invalid("request", `must not contain the NUL character \u0000 (Postgres cannot store it)`)
	}
	if hasNULEscape(j.Metadata) {
		return invalid("metadata", `must not contain the NUL character \u0000 (Postgres cannot store it)`)
	}
	return nil
}

// hasNULEscape reports whether JSON text holds the escape \u0000.
func hasNULEscape(raw []byte) bool { return nextNULEscape(raw, 0) >= 0 }

// ReplaceNULEscapes returns JSON text with each escape \u0000 replaced by
// \ufffd, the replacement character, so that Postgres's jsonb takes it;
// raw itself when it holds none. What a provider answers is stored so:
// refusing it would lose a paid answer, and fail the statement that stores
// the jobs beside it.
func ReplaceNULEscapes(raw []byte) []byte {
	k := nextNULEscape(raw, 0)
	if k < 0 {
		return raw
	}
	out := bytes.Clone(raw)
	for ; k >= 0; k = nextNULEscape(out, k+len(`\ufffd`)) {
		copy(out[k:], `\ufffd`)
	}
	return out
}

// nextNULEscape is the index of the first escape \u0000 in raw at or
// after from, or -1.
func nextNULEscape(raw []byte, from int) int {
	for i := from; ; {
		k := bytes.Index(raw[i:], []byte(`\u0000`))
		if k < 0 {
			return -1
		}
		k += i
		// The escape counts only if its backslash is not itself escaped.
		n := 0
		for b := k - 1; b >= 0 && raw[b] == '\\'; b-- {
			n++
		}
		if n%2 == 0 {
			return k
		}
		i = k + 1
	}
}
