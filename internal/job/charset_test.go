package job

import (
	"regexp"
	"testing"
)

// The regexps the contract states the name rules with; the charsets
// must answer as they do.
var namePatterns = []struct {
	name  string
	re    *regexp.Regexp
	chars *charset
	most  int
}{
	{"id", regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`), idChars, maxIDLen},
	{"tenant", regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`), tenantChars, maxTenantLen},
	{"model", regexp.MustCompile(`^[A-Za-z0-9._:/-]{1,128}$`), modelChars, maxModelLen},
	{"reply suffix", regexp.MustCompile(`^[A-Za-z0-9._:-]+$`), replySuffixChars, 0},
	{"topic", regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`), topicChars, maxTopicLen},
}

func checkCharsets(t *testing.T, s string) {
	for _, p := range namePatterns {
		if got, want := p.chars.matches(s, p.most), p.re.MatchString(s); got != want {
			t.Errorf("%s %q: charset %v, regexp %v", p.name, s, got, want)
		}
	}
}

func TestCharsetsMatchTheContractsPatterns(t *testing.T) {
	long := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = 'a'
		}
		return string(b)
	}
	for _, s := range []string{
		"", "a", "A-z_0.9:", "ticket-4711", "qwen-plus", "acme/qwen:7b", "a b", "a\n", "\na", "é", "a\xff",
		"..", "a.b", "a/b", "a:b", "a_b", "a-b", "a+b", "a\x00", long(64), long(65), long(128), long(129),
		long(249), long(250), long(1000),
	} {
		checkCharsets(t, s)
	}
	for b := range 256 {
		checkCharsets(t, string([]byte{byte(b)}))
		checkCharsets(t, "a"+string([]byte{byte(b)})+"z")
	}
}

func FuzzCharsetsMatchTheContractsPatterns(f *testing.F) {
	for _, s := range []string{"ticket-4711", "acme/qwen:7b", "a b", "é", ".."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkCharsets(t, s) })
}

// BenchmarkNameRules times a job's three name checks (ID, tenant, model)
// with the charsets and with the regexps they replace.
func BenchmarkNameRules(b *testing.B) {
	id, tenant, model := "ticket-4711-2026-12-07", "acme", "qwen-plus"
	b.Run("charset", func(b *testing.B) {
		for range b.N {
			if !idChars.matches(id, maxIDLen) || !tenantChars.matches(tenant, maxTenantLen) || !modelChars.matches(model, maxModelLen) {
				b.Fatal("refused")
			}
		}
	})
	b.Run("regexp", func(b *testing.B) {
		for range b.N {
			if !namePatterns[0].re.MatchString(id) || !namePatterns[1].re.MatchString(tenant) || !namePatterns[2].re.MatchString(model) {
				b.Fatal("refused")
			}
		}
	})
}
