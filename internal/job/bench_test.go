package job

import (
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
