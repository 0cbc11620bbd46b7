package job

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"unicode/utf8"

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

// decodeValid, where it takes a message, gives the job the decoder gives;
// where it does not, Decode's answer is the decoder's, error and all.
func FuzzDecodeValidAgreesWithDecoder(f *testing.F) {
	for _, s := range []string{
		`{"id":"a","model":"m","request":{"messages":[]}}`,
		`{"id":"a","tenant":"t","model":"m","kind":"chat","fallback_models":["x","y"],"priority":"high",` +
			`"request":{"messages":[{"role":"user","content":"h\u00e9"}]},"max_attempts":3,` +
			`"deadline":"2026-12-01T10:00:00Z","metadata":{"k":[1,2]},"reply_to":"r","correlation_id":"c",` +
			`"callback_url":"https://x","result_topic":"t"}`,
		`{"id":null,"request":null,"metadata":null,"fallback_models":null,"deadline":null,"max_attempts":null}`,
		`{"id":"a","id":"b"}`, `{"ID":"a"}`, `{"i\u0064":"a"}`, `{"id":1}`, `{"max_attempts":1.5}`,
		`{"deadline":"tomorrow"}`, `{"fallback_models":"x"}`, `[]`, `"x"`, `{} {}`, `{"id":"a"`, ` { "id" : "a" } `,
		`{"unknown":1}`, `{"request": {"a": "\ud800"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !utf8.Valid(data) {
			return
		}
		want, wantErr := decodeStrict(data)
		got, ok := decodeValid(data)
		if ok {
			if wantErr != nil {
				t.Fatalf("decodeValid took %q, the decoder refuses it: %v", data, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decodeValid(%q) = %#v, the decoder %#v", data, got, want)
			}
		}
		job, err := Decode(data, Limits{})
		if fmt.Sprint(err) != fmt.Sprint(wantErr) {
			t.Fatalf("Decode(%q) error %v, the decoder's %v", data, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(job, want) {
			t.Fatalf("Decode(%q) = %#v, the decoder %#v", data, job, want)
		}
	})
}
