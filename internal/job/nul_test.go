package job

import "testing"

func TestReplaceNULEscapes(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":"x"}`:                  `{"a":"x"}`,
		`{"a":"x\u0000y\u0000"}`:     `{"a":"x\ufffdy\ufffd"}`,
		`{"a":"x\\u0000y"}`:          `{"a":"x\\u0000y"}`, // an escaped backslash, then text
		`{"a":"x\\\u0000y"}`:         `{"a":"x\\\ufffdy"}`,
		`{"\u0000":1,"b":"\u00000"}`: `{"\ufffd":1,"b":"\ufffd0"}`,
	} {
		if got := string(ReplaceNULEscapes([]byte(in))); got != want {
			t.Errorf("ReplaceNULEscapes(%s) = %s, want %s", in, got, want)
		}
		if got := hasNULEscape([]byte(in)); got != (in != want) {
			t.Errorf("hasNULEscape(%s) = %v", in, got)
		}
	}
}
