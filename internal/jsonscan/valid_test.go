package jsonscan_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/jsonscan"
)

var validCases = []string{
	``, ` `, `x`, `{`, `}`, `[`, `]`, `{]`, `[}`, `{}`, `[]`, ` [ ] `, `{} {}`, `[],`, `{,}`, `[,]`, `[1,]`, `[,1]`,
	`{"a"}`, `{"a":}`, `{"a":1,}`, `{"a" 1}`, `{1:1}`, `{"a":1 "b":2}`, `{"a":1,"b":[true,false,null]}`,
	`"`, `"\"`, `"\\"`, `"\/\b\f\n\r\t"`, `"\u00e9\uD83D\uDE00"`, `"\u00"`, `"\u00g0"`, `"\x"`, `"\'"`,
	"\"a\x00b\"", "\"a\x1fb\"", "\"tab\there\"", "\"\x7f\"", "\"\xff\xfe\"", "\"caf\xc3\xa9\"",
	`"` + strings.Repeat("0123456789", 9) + `"`, `"` + strings.Repeat("abcdefg\\n", 9) + `"`,
	`0`, `-0`, `01`, `-`, `1.`, `.5`, `1.5`, `1e5`, `1E+5`, `1e-5`, `1e`, `1e+`, `-1.5e-10`, `2.`, `00`, `1.5.5`, `+1`, `0x10`,
	`true`, `false`, `null`, `tru`, `nul`, `truex`, `nullnull`, `True`, `[true false]`,
	"\t\n\r {\"a\" :\t[ 1 , 2 ] }\r\n", "\f1", "1\v",
	`{"model":"m","messages":[{"role":"user","content":"hi, \"you\" {[ ]}"}],"max_tokens":16,"n":null}`,
}

// TestValidAgreesWithDecoder: Valid is encoding/json.Valid, on valid and
// broken input, and at encoding/json's nesting limit.
func TestValidAgreesWithDecoder(t *testing.T) {
	cases := append([]string{}, validCases...)
	for _, depth := range []int{9999, 10000, 10001} {
		cases = append(cases, strings.Repeat("[", depth)+strings.Repeat("]", depth),
			strings.Repeat(`{"a":`, depth)+"1"+strings.Repeat("}", depth),
			strings.Repeat("[", depth-1)+"{}"+strings.Repeat("]", depth-1))
	}
	for _, c := range cases {
		if got, want := jsonscan.Valid([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("Valid(%.60q) = %v, encoding/json says %v", c, got, want)
		}
	}
	for _, c := range corpus {
		if !jsonscan.Valid([]byte(c)) {
			t.Errorf("Valid(%q) = false", c)
		}
	}
}

func FuzzValidAgreesWithDecoder(f *testing.F) {
	for _, c := range append(validCases, corpus...) {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := jsonscan.Valid(data), json.Valid(data); got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", data, got, want)
		}
	})
}

// BenchmarkValid checks a chat job of 1 KB, as the intake does for every
// message.
func BenchmarkValid(b *testing.B) {
	job := []byte(`{"id":"ticket-4711","model":"qwen-plus","request":{"model":"qwen-plus","messages":[` +
		`{"role":"system","content":"Classify the ticket."},{"role":"user","content":"` + strings.Repeat("My invoice is wrong. ", 45) + `"}],` +
		`"max_tokens":64}}`)
	for _, c := range []struct {
		name  string
		valid func([]byte) bool
	}{{"jsonscan", jsonscan.Valid}, {"encoding_json", json.Valid}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(job)))
			for b.Loop() {
				if !c.valid(job) {
					b.Fatal("not valid")
				}
			}
		})
	}
}
