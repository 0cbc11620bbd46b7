package job

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const good = `{"id":"ticket-4711-summary","tenant":"support","model":"qwen-plus",
 "fallback_models":["qwen-flash"],"priority":"normal",
 "request":{"messages":[{"role":"user","content":"hi"}],"max_tokens":512},
 "max_attempts":5,"deadline":"2026-12-01T10:00:00Z","metadata":{"ticket":4711}}`

func TestParseContractExample(t *testing.T) {
	j, err := Parse([]byte(good), now, Limits{})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if j.ID != "ticket-4711-summary" || j.Tenant != "support" || j.Model != "qwen-plus" || j.Priority != PriorityNormal ||
		j.MaxAttempts != 5 || len(j.FallbackModels) != 1 || j.Deadline == nil || j.MaxTokens() != 512 {
		t.Fatalf("unexpected job %+v", j)
	}
}

func TestNormalizeDefaults(t *testing.T) {
	j, err := Parse([]byte(`{"id":"a","model":"m","request":{"messages":[{"role":"user","content":"x"}]}}`), now, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if j.Tenant != DefaultTenant || j.Priority != PriorityNormal || j.MaxAttempts != DefaultMaxAttempts {
		t.Fatalf("defaults not applied: %+v", j)
	}
}

func TestValidationNamesFieldAndRule(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"x"}]`
	cases := []struct {
		name, body, field, rule string
	}{
		{"missing id", `{"model":"m","request":{` + msgs + `}}`, "id", "required"},
		{"id charset", `{"id":"a/b","model":"m","request":{` + msgs + `}}`, "id", "[A-Za-z0-9._:-]"},
		{"id sql-ish", `{"id":"x'; drop table jobs;--","model":"m","request":{` + msgs + `}}`, "id", "[A-Za-z0-9._:-]"},
		{"id path traversal", `{"id":"../../etc/passwd","model":"m","request":{` + msgs + `}}`, "id", "[A-Za-z0-9._:-]"},
		{"id dot", `{"id":".","model":"m","request":{` + msgs + `}}`, "id", "not only dots"},
		{"id dotdot", `{"id":"..","model":"m","request":{` + msgs + `}}`, "id", "not only dots"},
		{"id too long", `{"id":"` + strings.Repeat("a", 129) + `","model":"m","request":{` + msgs + `}}`, "id", "1..128"},
		{"tenant", `{"id":"a","tenant":"a b","model":"m","request":{` + msgs + `}}`, "tenant", "1..64"},
		{"missing model", `{"id":"a","request":{` + msgs + `}}`, "model", "required"},
		{"bad fallback", `{"id":"a","model":"m","fallback_models":["ok","no pe"],"request":{` + msgs + `}}`, "fallback_models[1]", "characters"},
		{"priority", `{"id":"a","model":"m","priority":"urgent","request":{` + msgs + `}}`, "priority", "high, normal, low"},
		{"max_attempts low", `{"id":"a","model":"m","max_attempts":-1,"request":{` + msgs + `}}`, "max_attempts", "between 1 and 50"},
		{"max_attempts high", `{"id":"a","model":"m","max_attempts":51,"request":{` + msgs + `}}`, "max_attempts", "between 1 and 50"},
		{"deadline past", `{"id":"a","model":"m","deadline":"2020-01-01T00:00:00Z","request":{` + msgs + `}}`, "deadline", "past"},
		{"deadline format", `{"id":"a","model":"m","deadline":"tomorrow","request":{` + msgs + `}}`, "deadline", "RFC 3339"},
		{"missing request", `{"id":"a","model":"m"}`, "request", "required"},
		{"request not object", `{"id":"a","model":"m","request":[1]}`, "request", "object"},
		{"no messages", `{"id":"a","model":"m","request":{"messages":[]}}`, "request.messages", "non-empty"},
		{"messages wrong type", `{"id":"a","model":"m","request":{"messages":"hi"}}`, "request.messages", "wrong type"},
		{"message not object", `{"id":"a","model":"m","request":{"messages":["hi"]}}`, "request.messages[0]", "object"},
		{"absurd max_tokens", `{"id":"a","model":"m","request":{` + msgs + `,"max_tokens":100000000}}`, "request.max_tokens", "between 1 and"},
		{"zero max_tokens", `{"id":"a","model":"m","request":{` + msgs + `,"max_tokens":0}}`, "request.max_tokens", "between 1 and"},
		{"fractional max_tokens", `{"id":"a","model":"m","request":{` + msgs + `,"max_tokens":1.5}}`, "request.max_tokens", "integer"},
		{"metadata", `{"id":"a","model":"m","metadata":[1],"request":{` + msgs + `}}`, "metadata", "object"},
		{"wrong type", `{"id":7,"model":"m","request":{` + msgs + `}}`, "id", "a string"},
		{"unknown field", `{"id":"a","model":"m","reqest":{}}`, "reqest", "unknown field"},
		{"not json", `hello`, "", "malformed JSON"},
		{"not object", `[1,2]`, "", "JSON object"},
		{"trailing", `{"id":"a","model":"m","request":{` + msgs + `}} {}`, "", "after the job object"},
		{"empty", ``, "", "empty or truncated"},
		{"invalid utf8", "{\"id\":\"a\",\"model\":\"m\xff\"}", "", "UTF-8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.body), now, Limits{})
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v, want *ValidationError", err)
			}
			if ve.Field != tc.field || !strings.Contains(ve.Rule, tc.rule) {
				t.Fatalf("got field %q rule %q, want field %q rule containing %q", ve.Field, ve.Rule, tc.field, tc.rule)
			}
			if !IsValidation(err) {
				t.Fatal("IsValidation false")
			}
			// A queued message breaks the same rules, but for a deadline
			// that passed while it waited.
			_, err = ParseQueued([]byte(tc.body), "", Limits{})
			if tc.name == "deadline past" {
				if err != nil {
					t.Fatalf("ParseQueued refused a passed deadline: %v", err)
				}
				return
			}
			if !errors.As(err, &ve) || ve.Field != tc.field {
				t.Fatalf("ParseQueued: got %v, want field %q", err, tc.field)
			}
		})
	}
}

func TestParseQueuedKeepsTheDeadline(t *testing.T) {
	j, err := ParseQueued([]byte(good), "", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if j.Deadline == nil || !j.Deadline.Equal(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)) || j.Tenant != "support" {
		t.Fatalf("ParseQueued lost the deadline or defaults: %+v", j)
	}
}

func TestPayloadLimit(t *testing.T) {
	body := `{"id":"a","model":"m","request":{"messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}}`
	if _, err := Parse([]byte(body), now, Limits{MaxPayloadBytes: 1000}); err == nil || !strings.Contains(err.Error(), "over the 1000 byte limit") {
		t.Fatalf("got %v", err)
	}
	if _, err := Parse([]byte(body), now, Limits{}); err != nil {
		t.Fatalf("default 1 MiB limit refused a 2 KB job: %v", err)
	}
}

func TestRequiredCapabilities(t *testing.T) {
	cases := map[string]string{
		`{"messages":[{"role":"user","content":"x"}]}`:                                          "",
		`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}`:            "tools",
		`{"messages":[{"role":"user","content":"x"}],"tools":[]}`:                               "",
		`{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}}`: "json_schema",
		`{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"}}`:        "",
		`{"messages":[],"functions":[{}],"response_format":{"type":"json_object"}}`:             "tools,json_object",
	}
	for req, want := range cases {
		j := Job{Request: []byte(req)}
		if got := strings.Join(j.RequiredCapabilities(), ","); got != want {
			t.Errorf("%s: got %q want %q", req, got, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte(`{"id":"a","model":"m","request":{"messages":[{}]}}`))
	f.Add([]byte("{\"id\":\"\xff\"}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := Parse(data, now, Limits{MaxPayloadBytes: 4096})
		if err != nil {
			if !IsValidation(err) {
				t.Fatalf("non-validation error %T: %v", err, err)
			}
			return
		}
		// Whatever parses must satisfy the contract's rules.
		if !ValidID(j.ID) || !ValidTenant(j.Tenant) || !j.Priority.Valid() || j.MaxAttempts < 1 || j.MaxAttempts > MaxAttemptsLimit {
			t.Fatalf("accepted an invalid job: %+v", j)
		}
	})
}

func TestParseQueuedTakesTheLanePriority(t *testing.T) {
	j, err := ParseQueued([]byte(`{"id":"a","model":"m","request":{"messages":[{}]}}`), PriorityHigh, Limits{})
	if err != nil || j.Priority != PriorityHigh {
		t.Fatalf("a message without priority on lane high: got %q, %v", j.Priority, err)
	}
	j, err = ParseQueued([]byte(`{"id":"a","model":"m","priority":"low","request":{"messages":[{}]}}`), PriorityHigh, Limits{})
	if err != nil || j.Priority != PriorityLow {
		t.Fatalf("a message's own priority wins: got %q, %v", j.Priority, err)
	}
}

// TestFieldNamesAreExact: encoding/json would read "ID" as id and
// "Messages" as messages, and a numeric string as a number; the contract's
// names and types are exact, since the provider receives the request as is.
func TestFieldNamesAreExact(t *testing.T) {
	for _, tc := range []struct{ body, field string }{
		{`{"ID":"a","model":"m","request":{"messages":[{}]}}`, "ID"},
		{`{"id":"a","Model":"m","request":{"messages":[{}]}}`, "Model"},
		{`{"id":"a","model":"m","request":{"Messages":[{}]}}`, "request.messages"},
		{`{"id":"a","model":"m","request":{"messages":[{}],"max_tokens":"64"}}`, "request.max_tokens"},
		{`{"id":"a","model":"m","request":{"messages":[{}]},"deadline":5}`, "deadline"},
	} {
		_, err := ParseQueued([]byte(tc.body), "", Limits{})
		var v *ValidationError
		if !errors.As(err, &v) || v.Field != tc.field {
			t.Errorf("%s: got %v, want an error naming %q", tc.body, err, tc.field)
		}
	}
	j, err := ParseQueued([]byte(`{"id":"a","model":"m","request":{"messages":[{}],"MAX_TOKENS":0}}`), "", Limits{})
	if err != nil || j.MaxTokens() != 0 {
		t.Fatalf("a key llmq does not read passes through to the provider: %v, max_tokens %d", err, j.MaxTokens())
	}
}
