package job

import "bytes"

// checkStorable refuses a request or metadata holding an escape
// (nextUnstorableEscape) or a number (unstorableNumber) that Postgres's
// jsonb cannot store. encoding/json accepts them; the insert of a batch that held one such job would fail
// for every job in it, again at each redelivery.
func (j *Job) checkStorable() error {
	for _, f := range []struct {
		field string
		raw   []byte
	}{{"request", j.Request}, {"metadata", j.Metadata}} {
		if n := unstorableNumber(f.raw); n != nil {
			if len(n) > 40 {
				n = append(n[:37:37], "..."...)
			}
			return invalid(f.field, "must not hold the number %s, which Postgres's numeric cannot store (more than 131072 digits before the decimal point or 16383 after it)", n)
		}
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
		v, ok := hex4(raw, k+2)
		switch {
		case escaped(raw, k) || !ok: // its backslash is itself escaped: text
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

// Postgres's numeric, which jsonb stores numbers as, holds at most 131072
// digits before the decimal point and 16383 after it (PostgreSQL 15,
// NUMERIC_WEIGHT_MAX and NUMERIC_DSCALE_MAX).
const (
	maxNumericDigitsBefore = 131072
	maxNumericDigitsAfter  = 16383
)

// unstorableNumber returns the first number in valid JSON text raw that
// Postgres's numeric cannot hold (1e999999, 1e-20000), or nil. It reads
// numbers outside strings only.
func unstorableNumber(raw []byte) []byte {
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '"':
			i = stringClose(raw, i+1)
		case c == '-' || ('0' <= c && c <= '9'):
			end := numberEnd(raw, i)
			if !numericHolds(raw[i:end]) {
				return raw[i:end]
			}
			i = end - 1
		}
	}
	return nil
}

// stringClose is the index of the quote that closes the JSON string whose
// content starts at i (len(raw) if none): the first quote not escaped by
// an odd run of backslashes.
func stringClose(raw []byte, i int) int {
	for {
		k := bytes.IndexByte(raw[i:], '"')
		if k < 0 {
			return len(raw)
		}
		k += i
		if !escaped(raw, k) {
			return k
		}
		i = k + 1
	}
}

// escaped reports whether raw[k] follows an odd run of backslashes: it is
// itself escaped, and so not what it would be on its own.
func escaped(raw []byte, k int) bool {
	n := 0
	for b := k - 1; b >= 0 && raw[b] == '\\'; b-- {
		n++
	}
	return n%2 == 1
}

// numberEnd is the index just past the JSON number that starts at i.
func numberEnd(raw []byte, i int) int {
	for ; i < len(raw); i++ {
		switch c := raw[i]; {
		case '0' <= c && c <= '9', c == '-', c == '+', c == '.', c == 'e', c == 'E':
		default:
			return i
		}
	}
	return i
}

// numericHolds reports whether Postgres's numeric holds the JSON number n:
// its digits before the decimal point, once the exponent is applied, and
// its scale (the digits after the point as written, less the exponent).
func numericHolds(n []byte) bool {
	n = bytes.TrimPrefix(n, []byte("-"))
	mant, exp := n, []byte(nil)
	if k := bytes.IndexAny(n, "eE"); k >= 0 {
		mant, exp = n[:k], n[k+1:]
	}
	intPart, frac := mant, []byte(nil)
	if k := bytes.IndexByte(mant, '.'); k >= 0 {
		intPart, frac = mant[:k], mant[k+1:]
	}
	e := 0
	if len(exp) > 0 {
		neg := exp[0] == '-'
		exp = bytes.TrimLeft(exp, "+-")
		exp = bytes.TrimLeft(exp, "0")
		if len(exp) > 9 {
			return false // far past either bound (Postgres refuses it too)
		}
		for _, c := range exp {
			e = e*10 + int(c-'0')
		}
		if neg {
			e = -e
		}
	}
	if len(frac)-e > maxNumericDigitsAfter {
		return false
	}
	sig := bytes.TrimLeft(intPart, "0")
	before := len(sig) + e
	if len(sig) == 0 {
		lead := len(frac) - len(bytes.TrimLeft(frac, "0"))
		if lead == len(frac) {
			return true // zero: no digits before the point however large e is
		}
		before = e - lead
	}
	return before <= maxNumericDigitsBefore
}
