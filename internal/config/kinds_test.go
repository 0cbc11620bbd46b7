package config

import (
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/job"
)

func TestModelKinds(t *testing.T) {
	c, err := Parse([]byte("models:\n  chat: {}\n  emb: {kind: embeddings, fallback: [emb2]}\n  emb2: {kind: embeddings}\n"), envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Models["chat"].KindOf() != job.KindChat || c.Models["emb"].KindOf() != job.KindEmbeddings {
		t.Fatalf("kinds: %+v", c.Models)
	}
	for _, tc := range []struct{ yaml, key, msg string }{
		{"models:\n  a: {kind: image}\n", "models.a.kind", `got "image"`},
		{"models:\n  a: {kind: embeddings, fallback: [b]}\n  b: {}\n", "models.a.fallback", `"b", which serves chat jobs, not embeddings`},
		{"models:\n  a: {fallback: [b]}\n  b: {kind: embeddings}\n", "models.a.fallback", "serves embeddings jobs, not chat"},
		{"models:\n  a: {audio_seconds_per_minute: 60}\n", "models.a.audio_seconds_per_minute", "only an audio model"},
		{"models:\n  a: {kind: audio, tpm: 60}\n", "models.a", "not tokens"},
		{"models:\n  a: {task_endpoint: x/y}\n", "models.a.task_endpoint", "only a task model"},
		{"models:\n  a: {kind: task, tpm: 60}\n", "models.a", "running tasks (max_concurrency), not tokens"},
		{"models:\n  a: {kind: embeddings, batch: {enabled: true}}\n", "models.a.batch", "only a chat model can offload"},
	} {
		_, err := Parse([]byte(tc.yaml), envMap(nil))
		if err == nil || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%q: got %v, want an error naming %s: %s", tc.yaml, err, tc.key, tc.msg)
		}
	}
}

func TestCheckJobModels(t *testing.T) {
	models := map[string]Model{"chat": {}, "emb": {Kind: "embeddings"}}
	cases := []struct {
		j     job.Job
		field string
	}{
		{job.Job{Model: "chat"}, ""},
		{job.Job{Model: "chat", Kind: job.KindChat}, ""},
		{job.Job{Model: "emb", Kind: job.KindEmbeddings}, ""},
		{job.Job{Model: "emb"}, "model"},
		{job.Job{Model: "chat", Kind: job.KindEmbeddings}, "model"},
		{job.Job{Model: "nope"}, "model"},
		{job.Job{Model: "emb", Kind: job.KindEmbeddings, FallbackModels: []string{"chat"}}, "fallback_models[0]"},
	}
	for _, c := range cases {
		err := CheckJobModels(models, &c.j)
		var field string
		if v, ok := err.(*job.ValidationError); ok {
			field = v.Field
		} else if err != nil {
			t.Fatalf("%+v: %T %v", c.j, err, err)
		}
		if field != c.field {
			t.Errorf("%+v: error %v, want field %q", c.j, err, c.field)
		}
	}
	if err := CheckJobModels(nil, &job.Job{Model: "any", Kind: job.KindTask}); err != nil {
		t.Errorf("no models configured: %v", err)
	}
}
