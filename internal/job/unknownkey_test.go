package job

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The byte scan finds the same first unknown key as the decoder's token
// walk, on valid JSON with the shapes that could mislead a scan: nested
// objects and arrays whose keys are not the job's, strings holding
// braces, quotes and commas, escaped keys, case variants.
func TestFirstUnknownKeyMatchesDecoder(t *testing.T) {
	for _, obj := range []string{
		`{}`,
		` {"id":"a","tenant":"t"} `,
		`{"id":"a","ID":"b"}`,
		`{"request":{"messages":[{"role":"user","content":"x"}],"extra":{"nested":1}},"model":"m"}`,
		`{"request":{"bogus":1},"bogus2":2}`,
		`{"metadata":{"a":[1,{"b":"}"}],"c":"\"{,"},"zzz":true}`,
		`{"id":"\"quoted\" , \"fake\":1","x":null}`,
		`{"\u0069d":"escaped known","t\u0065nant":"t"}`,
		`{"\u0078":"escaped unknown"}`,
		`{"fallback_models":["a","b"],"priority":"high","deadline":"2026-01-01T00:00:00Z","Tenant":"t"}`,
		`{"request":[[[{"x":1}]]],"kind":"chat"}`,
		`[{"x":1}]`,
		`"not an object"`,
	} {
		require.True(t, json.Valid([]byte(obj)), obj)
		assert.Equal(t, firstUnknownKeyDecoded([]byte(obj), jobFields), firstUnknownKey([]byte(obj), jobFields), obj)
	}
}
