package job

import "bytes"

// checkStorable refuses a request or metadata holding an escape that
// Postgres's jsonb cannot store (nextUnstorableEscape). encoding/json
// accepts them; the insert of a batch that held one such job would fail
// for every job in it, again at each redelivery.
func (j *Job) checkStorable() error {
	for _, f := range []struct {
		field string
		raw   []byte
	}{{"request", j.Request}, {"metadata", j.Metadata}} {
		k := nextUnstorableEscape(f.raw, 0)
		switch {
		case k < 0:
		case bytes.HasPrefix(f.raw[k:], []byte(`\u0000`)):
			return invalid(f.field, `must not contain the NUL character \u0000 (Postgres cannot store it)`)
		default:
			return invalid(f.field, "must not contain %s, a UTF-16 surrogate escape that is not half of a pair (Postgres cannot store it)", f.raw[k:k+6])
		}
	}
	return nil
}

// hasUnstorableEscape reports whether JSON text holds an escape that
// Postgres's jsonb refuses.
func hasUnstorableEscape(raw []byte) bool { return nextUnstorableEscape(raw, 0) >= 0 }

// ReplaceUnstorableEscapes returns JSON text with each escape Postgres's
// jsonb refuses (nextUnstorableEscape) replaced by \ufffd, the replacement
// character; raw itself when it holds none. What a provider answers is
// stored so: refusing it would lose a paid answer, and fail the statement
// that stores the jobs beside it.
func ReplaceUnstorableEscapes(raw []byte) []byte {
	k := nextUnstorableEscape(raw, 0)
	if k < 0 {
		return raw
	}
	out := bytes.Clone(raw)
	for ; k >= 0; k = nextUnstorableEscape(out, k+len(`\ufffd`)) {
		copy(out[k:], `\ufffd`) // every such escape is six bytes, as is this one
	}
	return out
}

// nextUnstorableEscape is the index in JSON text raw, at or after from, of
// the first escape that Postgres's jsonb refuses, or -1: \u0000, and a
// UTF-16 surrogate that is not half of a pair (a high one, \ud800 to
// \udbff, followed at once by a low one, \udc00 to \udfff).
func nextUnstorableEscape(raw []byte, from int) int {
	for i := from; i < len(raw); {
		k := bytes.Index(raw[i:], []byte(`\u`))
		if k < 0 {
			return -1
		}
		k += i
		// The escape counts only if its backslash is not itself escaped.
		n := 0
		for b := k - 1; b >= 0 && raw[b] == '\\'; b-- {
			n++
		}
		v, ok := hex4(raw, k+2)
		switch {
		case n%2 == 1 || !ok:
			i = k + 1
			continue
		case v == 0, v >= 0xdc00 && v <= 0xdfff:
			return k
		case v >= 0xd800 && v <= 0xdbff:
			if lo, ok := hex4(raw, k+8); !ok || raw[k+6] != '\\' || raw[k+7] != 'u' || lo < 0xdc00 || lo > 0xdfff {
				return k
			}
			i = k + 12 // the pair
			continue
		}
		i = k + 6
	}
	return -1
}

// hex4 reads the four hexadecimal digits at raw[at:].
func hex4(raw []byte, at int) (v int, ok bool) {
	if at < 0 || at+4 > len(raw) {
		return 0, false
	}
	for _, c := range raw[at : at+4] {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | int(d)
	}
	return v, true
}
