package config

import (
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/job"
)

func TestRequestFieldsReachTheJobLimits(t *testing.T) {
	c, err := Parse([]byte("limits:\n  request_fields:\n    n: {action: cap, max: 8}\n    store: {action: allow}\n"), envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	got := c.Limits.Job()
	want := map[string]job.FieldRule{"n": {Action: job.FieldCap, Max: 8}, "store": {Action: job.FieldAllow}}
	if len(got.RequestFields) != 2 || got.RequestFields["n"] != want["n"] || got.RequestFields["store"] != want["store"] {
		t.Errorf("RequestFields = %v, want %v", got.RequestFields, want)
	}
	if got.MaxOutputTokens != 131072 || got.MaxPayloadBytes != 1<<20 {
		t.Errorf("limits lost their defaults: %+v", got)
	}
}

func TestRequestFieldErrorsNameTheKey(t *testing.T) {
	for yaml, key := range map[string]string{
		"limits:\n  request_fields:\n    n: {action: drop}\n": "limits.request_fields.n",
		"limits:\n  request_fields:\n    n: {action: cap}\n":  "limits.request_fields.n",
		"limits:\n  request_fields:\n    store: {max: 1}\n":   "limits.request_fields.store",
	} {
		_, err := Parse([]byte(yaml), envMap(nil))
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%q: got %v, want an error naming %s", yaml, err, key)
		}
	}
}
