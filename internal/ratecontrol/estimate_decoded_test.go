package ratecontrol

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/llmq/llmq/internal/jsonscan"
)

// estimateTokensDecoded is EstimateTokens as it was written over
// encoding/json, kept as the reference the single-pass walk must match.
func estimateTokensDecoded(requestBody []byte) int {
	var b struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
			Name    string          `json:"name"`
		} `json:"messages"`
		Tools            json.RawMessage `json:"tools"`
		EnableSearch     json.RawMessage `json:"enable_search"`
		WebSearchOptions json.RawMessage `json:"web_search_options"`
	}
	if json.Unmarshal(requestBody, &b) != nil || len(b.Messages) == 0 {
		return textTokens(string(requestBody)) + estimatePriming
	}
	n := estimatePriming
	for _, m := range b.Messages {
		n += estimatePerMessage + textTokens(m.Role) + textTokens(m.Name)
		if len(m.Content) == 0 {
			continue
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			n += textTokens(s)
			continue
		}
		var parts []contentPart
		if json.Unmarshal(m.Content, &parts) == nil {
			for _, p := range parts {
				n += textTokens(p.Text)
			}
		}
	}
	if len(b.Tools) > 0 && string(b.Tools) != "null" {
		n += (len(b.Tools) + estimateCharsPerToken - 1) / estimateCharsPerToken
	}
	if turnedOn(b.EnableSearch) || turnedOn(b.WebSearchOptions) {
		n += estimateSearch
	}
	return n
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

var estimateCorpus = []string{
	`{"model":"m","messages":[{"role":"user","content":"hello there, how are you?"}]}`,
	`{"messages":[{"role":"system","content":"你好，世界"},{"role":"user","name":"bob","content":"a\nb\"c\u00e9"}],"max_tokens":5}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"x"}},null]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":7}]}]}`,
	`{"messages":[{"role":"user","content":{"text":"x"}}]}`,
	`{"messages":[{"role":"user","content":null},null]}`,
	`{"messages":[{"role":5,"content":"x"}]}`,
	`{"messages":["x"]}`,
	`{"messages":[]}`,
	`{"messages":null,"tools":[{"type":"function"}]}`,
	`{"messages":"nope"}`,
	`{"messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"f"}}],"enable_search":true}`,
	`{"messages":[{"role":"user","content":"q"}],"enable_search":false,"web_search_options":{}}`,
	`{"messages":[{"role":"user","content":"q"}],"messages":[{"role":"user","content":"second wins"}]}`,
	`not json at all`,
	`[1,2]`,
	`{}`,
}

// The single pass counts what the decoder-based estimate counted.
func TestEstimateMatchesDecoded(t *testing.T) {
	for _, in := range estimateCorpus {
		assert.Equal(t, estimateTokensDecoded([]byte(in)), EstimateTokens([]byte(in)), "%s", in)
	}
}

func FuzzEstimateMatchesDecoded(f *testing.F) {
	for _, in := range estimateCorpus {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if !json.Valid(in) || foldedKey(in) || repeatedKey(in) {
			// The decoder matches keys case-insensitively and decodes a
			// repeated array key into the first one's elements; the walk
			// matches exactly and takes the last, by design.
			return
		}
		assert.Equal(t, estimateTokensDecoded(in), EstimateTokens(in), "%q", in)
	})
}

// repeatedKey: in is an object that names one key twice.
func repeatedKey(in []byte) bool {
	seen, repeated := map[string]bool{}, false
	jsonscan.Members(in, func(k string, _ []byte) bool {
		repeated = repeated || seen[k]
		seen[k] = true
		return true
	})
	return repeated
}

// foldedKey: in spells one of the keys the estimate reads in another case.
func foldedKey(in []byte) bool {
	lower := bytes.ToLower(in)
	for _, k := range []string{"messages", "tools", "enable_search", "web_search_options", "role", "name", "content", "type", "text"} {
		q := []byte(`"` + k + `"`)
		if bytes.Count(lower, q) != bytes.Count(in, q) || bytes.Contains(in, []byte(`\u`)) {
			return true
		}
	}
	return false
}

// BenchmarkEstimateTokens: the walk against the decoder-based reference,
// on a 1 KB chat body.
func BenchmarkEstimateTokens(b *testing.B) {
	body := []byte(`{"model":"qwen-plus","messages":[{"role":"system","content":"Classify the ticket."},` +
		`{"role":"user","content":"` + strings.Repeat("My invoice is wrong. ", 45) + `"}],"max_tokens":64}`)
	for _, c := range []struct {
		name string
		fn   func([]byte) int
	}{{"walk", EstimateTokens}, {"decoded", estimateTokensDecoded}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.fn(body)
			}
		})
	}
}
