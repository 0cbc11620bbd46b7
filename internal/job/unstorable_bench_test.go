package job

import (
	"strings"
	"testing"
)

// BenchmarkUnstorableScan is the intake's check of a 1 KB request for
// escapes and numbers Postgres cannot store: plain ASCII, and text whose
// every character is a \u escape (Python's json.dumps escapes non-ASCII
// so).
func BenchmarkUnstorableScan(b *testing.B) {
	for _, c := range []struct{ name, content string }{
		{"ascii", strings.Repeat("ticket text ", 85)},
		{"escaped", strings.Repeat(`\u4f60\u597d`, 85)},
	} {
		raw := []byte(`{"messages":[{"role":"user","content":"` + c.content + `"}],"max_tokens":64}`)
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if hasUnstorableEscape(raw) || unstorableNumber(raw) != nil {
					b.Fatal("found one")
				}
			}
		})
	}
}
