package job

import (
	"strings"
	"testing"
	"time"
)

// BenchmarkParse is the cost of judging one typical job, as the API and
// the ingester do for every message (request-field rules included).
func BenchmarkParse(b *testing.B) {
	body := []byte(`{"id":"ticket-4711","tenant":"acme","model":"qwen-plus","request":{"messages":[` +
		`{"role":"system","content":"Classify the ticket."},{"role":"user","content":"My invoice is wrong, please fix it."}],` +
		`"max_tokens":256,"temperature":0.2,"n":1}}`)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(body, now, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadChatJob is what the intake and the route read from one job
// of the side-by-side harness's shape (a 1 KB request): judging it, then
// its output cap and the capabilities its fallbacks must have.
func BenchmarkReadChatJob(b *testing.B) {
	body := []byte(`{"id":"ticket-4711","model":"qwen-plus","request":{"model":"qwen-plus","messages":[` +
		`{"role":"system","content":"Classify the ticket."},{"role":"user","content":"` + strings.Repeat("My invoice is wrong. ", 45) + `"}],` +
		`"max_tokens":64}}`)
	b.ReportAllocs()
	for b.Loop() {
		j, err := ParseQueued(body, PriorityNormal, Limits{})
		if err != nil {
			b.Fatal(err)
		}
		if j.MaxTokens() != 64 || j.RequiredCapabilities() != nil {
			b.Fatal("misread")
		}
	}
}
