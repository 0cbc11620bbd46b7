package job

import "testing"

func TestReplaceUnstorableEscapes(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":"x"}`:                         `{"a":"x"}`,
		`{"a":"x\u0000y\u0000"}`:            `{"a":"x\ufffdy\ufffd"}`,
		`{"a":"x\\u0000y"}`:                 `{"a":"x\\u0000y"}`, // an escaped backslash, then text
		`{"a":"x\\\u0000y"}`:                `{"a":"x\\\ufffdy"}`,
		`{"\u0000":1,"b":"\u00000"}`:        `{"\ufffd":1,"b":"\ufffd0"}`,
		`{"a":"\ud83d\ude00 \uD83D\uDE00"}`: `{"a":"\ud83d\ude00 \uD83D\uDE00"}`, // pairs, either case
		`{"a":"\ud800"}`:                    `{"a":"\ufffd"}`,                    // a high one alone
		`{"a":"\ud800x\udc00"}`:             `{"a":"\ufffdx\ufffd"}`,             // apart, both alone
		`{"a":"\udc00\ud800"}`:              `{"a":"\ufffd\ufffd"}`,              // low before high
		`{"a":"\ud800\ud800\udc00"}`:        `{"a":"\ufffd\ud800\udc00"}`,        // a high one, then a pair
		`{"a":"\\ud800","b":"\u00e9"}`:      `{"a":"\\ud800","b":"\u00e9"}`,      // text, and a plain escape
		`{"a":"x\ud800`:                     `{"a":"x\ufffd`,                     // cut short
		`{"a":"\u12"}`:                      `{"a":"\u12"}`,                      // not an escape: the decoder refuses it
	} {
		if got := string(ReplaceUnstorableEscapes([]byte(in))); got != want {
			t.Errorf("ReplaceUnstorableEscapes(%s) = %s, want %s", in, got, want)
		}
		if got := hasUnstorableEscape([]byte(in)); got != (in != want) {
			t.Errorf("hasUnstorableEscape(%s) = %v", in, got)
		}
	}
}

// Numbers Postgres's numeric cannot hold, as PostgreSQL 15 answers them
// (store's TestValidateAgreesWithJSONB asks the server itself).
func TestUnstorableNumber(t *testing.T) {
	for in, bad := range map[string]string{
		`{"a": 1, "b": -2.5e10, "c": [0.001, 1E-5]}`: "",
		`{"a": 1e131071}`:                     "",
		`{"a": 1e131072}`:                     "1e131072",
		`{"a": 123e131069}`:                   "",
		`{"a": 123e131070}`:                   "123e131070",
		`{"a": 0.05e131073}`:                  "",
		`{"a": 1e-16383}`:                     "",
		`{"a": 1e-16384}`:                     "1e-16384",
		`{"a": 0.5e-16383}`:                   "0.5e-16383",
		`{"a": 0e999999}`:                     "",
		`{"a": -1E+999999}`:                   "-1E+999999",
		`{"a": 1e99999999999999}`:             "1e99999999999999",
		`{"a": "1e999999", "1e999999": true}`: "", // strings, not numbers
		`{"a": "x\"1e999999"}`:                "",
	} {
		if got := string(unstorableNumber([]byte(in))); got != bad {
			t.Errorf("unstorableNumber(%s) = %q, want %q", in, got, bad)
		}
	}
}
