package job

// charset is a set of ASCII bytes that a name may be made of: letters,
// digits and a few punctuation marks. Matching one is the contract's
// name patterns (`^[A-Za-z0-9…]{1,n}$`) without a regexp, which the
// ingester would otherwise run three times for every job it reads
// (charset_test.go checks both agree).
type charset [256]bool

func newCharset(punct string) *charset {
	var c charset
	for b := 'a'; b <= 'z'; b++ {
		c[b], c[b-'a'+'A'] = true, true
	}
	for b := '0'; b <= '9'; b++ {
		c[b] = true
	}
	for i := range len(punct) {
		c[punct[i]] = true
	}
	return &c
}

// matches reports whether s is 1..most bytes of c (most 0: no bound).
// Every byte of c is ASCII, so bytes and runes count alike.
func (c *charset) matches(s string, most int) bool {
	if s == "" || most > 0 && len(s) > most {
		return false
	}
	for i := range len(s) {
		if !c[s[i]] {
			return false
		}
	}
	return true
}
