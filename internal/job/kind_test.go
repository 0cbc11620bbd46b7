package job

import (
	"strings"
	"testing"
)

func TestKindDefaultsToChat(t *testing.T) {
	j, err := Parse([]byte(`{"id":"a","model":"m","request":{"messages":[{"role":"user","content":"x"}]}}`), now, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if j.Kind != KindChat {
		t.Fatalf("kind = %q, want chat", j.Kind)
	}
}

func TestEmbeddingsJobParses(t *testing.T) {
	for _, input := range []string{`"hello"`, `["a","b"]`, `[[1,2,3]]`, `[1,2,3]`} {
		j, err := Parse([]byte(`{"id":"a","model":"m","kind":"embeddings","request":{"input":`+input+`}}`), now, Limits{})
		if err != nil {
			t.Fatalf("input %s: %v", input, err)
		}
		if j.Kind != KindEmbeddings || j.MaxTokens() != 0 {
			t.Fatalf("input %s: kind %q max tokens %d", input, j.Kind, j.MaxTokens())
		}
	}
}

func TestKindValidationNamesFieldAndRule(t *testing.T) {
	cases := []struct {
		name, body, field, rule string
	}{
		{"unknown kind", `{"id":"a","model":"m","kind":"image","request":{"input":"x"}}`, "kind", `chat, embeddings, task, audio; got "image"`},
		{"kind not a string", `{"id":"a","model":"m","kind":3,"request":{"input":"x"}}`, "kind", "a string"},
		{"embeddings without input", `{"id":"a","model":"m","kind":"embeddings","request":{"messages":[{"role":"user","content":"x"}]}}`, "request.input", "required"},
		{"embeddings empty input", `{"id":"a","model":"m","kind":"embeddings","request":{"input":""}}`, "request.input", "non-empty"},
		{"embeddings empty array", `{"id":"a","model":"m","kind":"embeddings","request":{"input":[]}}`, "request.input", "non-empty"},
		{"embeddings bad item", `{"id":"a","model":"m","kind":"embeddings","request":{"input":[{"x":1}]}}`, "request.input[0]", "string"},
		{"embeddings refused field", `{"id":"a","model":"m","kind":"embeddings","request":{"input":"x","service_tier":"priority"}}`, "request.service_tier", ""},
		{"audio without duration", `{"id":"a","model":"m","kind":"audio","request":{"url":"x"}}`, "request.duration_seconds", "required"},
		{"audio zero duration", `{"id":"a","model":"m","kind":"audio","request":{"duration_seconds":0}}`, "request.duration_seconds", "above 0"},
		{"audio duration string", `{"id":"a","model":"m","kind":"audio","request":{"duration_seconds":"9"}}`, "request.duration_seconds", "a number"},
		{"task not object", `{"id":"a","model":"m","kind":"task","request":[1]}`, "request", "object"},
		{"task without input", `{"id":"a","model":"m","kind":"task","request":{"prompt":"x"}}`, "request.input", "object"},
		{"chat still needs messages", `{"id":"a","model":"m","kind":"chat","request":{"input":"x"}}`, "request.messages", "non-empty"},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.body), now, Limits{})
		v, ok := err.(*ValidationError)
		if !ok {
			t.Errorf("%s: err = %v, want a ValidationError", c.name, err)
			continue
		}
		if v.Field != c.field || !strings.Contains(v.Rule, c.rule) {
			t.Errorf("%s: got %s: %s; want field %s rule containing %q", c.name, v.Field, v.Rule, c.field, c.rule)
		}
	}
}

func TestAudioSeconds(t *testing.T) {
	j, err := Parse([]byte(`{"id":"a","model":"m","kind":"audio","request":{"duration_seconds":40.2}}`), now, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := j.AudioSeconds(); got != 41 {
		t.Fatalf("AudioSeconds = %d, want 41", got)
	}
	j.Kind = KindChat
	if got := j.AudioSeconds(); got != 0 {
		t.Fatalf("a chat job has %d audio seconds", got)
	}
}
