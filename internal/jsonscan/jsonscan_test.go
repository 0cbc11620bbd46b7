package jsonscan_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jsonscan"
)

var corpus = []string{
	`{}`,
	` { } `,
	`{"a":1}`,
	`{"model":"m","messages":[{"role":"user","content":"hi, \"you\" {[ ]}"}],"max_tokens":16,"n":null}`,
	"{\n\t\"a\" : [1, 2.5e3, -3, true, false, null] ,\r\n \"b\":{\"c\":{\"d\":[]}} }",
	`{"k\u0065y":"v","k\\":"\\","a\"b":"\u00e9\ud83d\ude00"}`,
	`{"dup":1,"dup":2}`,
	`{"s":"\\\"","t":"]}"}`,
	`[]`,
	`[1,"two",{"three":[3]},[4],null]`,
	` [ {"role":"system"} , {"role":"user","content":[{"type":"text","text":"x"}]} ] `,
	`"plain"`,
	`"esc\naped \"q\" \u4e2d"`,
	`12`,
	`null`,
}

// Members, Elements and String agree with encoding/json on valid input.
func TestAgreesWithDecoder(t *testing.T) {
	for _, in := range corpus {
		agree(t, []byte(in))
	}
}

// Any input: no panic, and agreement wherever encoding/json accepts it.
func FuzzAgreesWithDecoder(f *testing.F) {
	for _, in := range corpus {
		f.Add([]byte(in))
	}
	for _, in := range []string{`{"a"`, `{"a":}`, `{"a":1,}`, `[1,]`, `{"a":"b`, `[`, `{`, `"`, `{"a":1 "b":2}`, `{1:2}`} {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if json.Valid(in) {
			agree(t, in)
			return
		}
		jsonscan.Members(in, func(string, []byte) bool { return true })
		jsonscan.Elements(in, func([]byte) bool { return true })
		jsonscan.String(in)
	})
}

func agree(t *testing.T, in []byte) {
	t.Helper()
	var obj map[string]json.RawMessage
	if json.Unmarshal(in, &obj) == nil && obj != nil {
		got := map[string]json.RawMessage{}
		require.True(t, jsonscan.Members(in, func(k string, v []byte) bool { got[k] = v; return true }), "%s", in)
		assert.Equal(t, compact(t, obj), compact(t, got), "members of %s", in)
	} else {
		assert.False(t, jsonscan.Members(in, func(string, []byte) bool { return true }), "%s is no object", in)
	}
	var arr []json.RawMessage
	if json.Unmarshal(in, &arr) == nil && arr != nil {
		var got []json.RawMessage
		require.True(t, jsonscan.Elements(in, func(e []byte) bool { got = append(got, e); return true }), "%s", in)
		assert.Equal(t, compactAll(t, arr), compactAll(t, got), "elements of %s", in)
	} else {
		assert.False(t, jsonscan.Elements(in, func([]byte) bool { return true }), "%s is no array", in)
	}
	var s string
	want := json.Unmarshal(in, &s) == nil && jsonscan.Kind(in) == '"' // null decodes too
	got, ok := jsonscan.String(in)
	assert.Equal(t, want, ok, "string %s", in)
	assert.Equal(t, s, got, "string %s", in)
}

func compact(t *testing.T, m map[string]json.RawMessage) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = compactOne(t, v)
	}
	return out
}

func compactAll(t *testing.T, vs []json.RawMessage) []string {
	var out []string
	for _, v := range vs {
		out = append(out, compactOne(t, v))
	}
	return out
}

func compactOne(t *testing.T, v []byte) string {
	var b bytes.Buffer
	require.NoError(t, json.Compact(&b, v), "value %q", v)
	return b.String()
}

// A walk stops where its callback says.
func TestStopsEarly(t *testing.T) {
	var keys []string
	assert.True(t, jsonscan.Members([]byte(`{"a":1,"b":2,"c":3}`), func(k string, _ []byte) bool {
		keys = append(keys, k)
		return k != "b"
	}))
	assert.Equal(t, []string{"a", "b"}, keys)
	n := 0
	assert.True(t, jsonscan.Elements([]byte(`[1,2,3]`), func([]byte) bool { n++; return false }))
	assert.Equal(t, 1, n)
}

func TestKind(t *testing.T) {
	assert.Equal(t, byte('{'), jsonscan.Kind([]byte(" \n{}")))
	assert.Equal(t, byte('n'), jsonscan.Kind([]byte("null")))
	assert.Equal(t, byte(0), jsonscan.Kind([]byte("  ")))
}

// Pick takes the last value of a key named twice, leaves a val whose key
// is absent as it was, and fails as Members does.
func TestPick(t *testing.T) {
	role, content, name := []byte("x"), []byte(nil), []byte("kept")
	assert.True(t, jsonscan.Pick([]byte(`{"role":"a","content":[1],"role":"b","other":2}`),
		[]string{"role", "content", "name"}, &role, &content, &name))
	assert.Equal(t, `"b"`, string(role))
	assert.Equal(t, `[1]`, string(content))
	assert.Equal(t, "kept", string(name))
	assert.False(t, jsonscan.Pick([]byte(`[1]`), []string{"role"}, &role))
}

// BenchmarkValueEnd scans a request's message text, as the intake and the
// token estimate do for every job: 1 KB plain, and with an escape every
// 40 bytes.
func BenchmarkValueEnd(b *testing.B) {
	plain := []byte(`"` + strings.Repeat("The quick brown fox jumps over the lazy dog. ", 23) + `"`)
	escaped := []byte(`"` + strings.Repeat(`line of text with a \"quote\" and\n`, 30) + `"`)
	for _, c := range []struct {
		name string
		s    []byte
	}{{"plain", plain}, {"escaped", escaped}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.s)))
			for b.Loop() {
				if jsonscan.ValueEnd(c.s, 0) != len(c.s) {
					b.Fatal("string end not found")
				}
			}
		})
	}
}
