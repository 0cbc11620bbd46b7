package ratecontrol

import "encoding/json"

// EstimateEmbeddingTokens estimates the input tokens of an OpenAI
// embeddings body, summed over its batch (every input is billed): a string
// counts as text does in EstimateTokens (at least 1 token), an array of
// token ids its length. There is no message framing or priming, and no
// output. A body that is not an embeddings body counts as text.
func EstimateEmbeddingTokens(requestBody []byte) int {
	var b struct {
		Input json.RawMessage `json:"input"`
	}
	if json.Unmarshal(requestBody, &b) != nil || len(b.Input) == 0 {
		return textTokens(string(requestBody))
	}
	var one string
	if json.Unmarshal(b.Input, &one) == nil {
		return max(textTokens(one), 1)
	}
	var items []json.RawMessage
	if json.Unmarshal(b.Input, &items) != nil {
		return textTokens(string(b.Input))
	}
	n := 0
	for _, it := range items {
		var s string
		var ids []json.RawMessage
		switch {
		case json.Unmarshal(it, &s) == nil:
			n += max(textTokens(s), 1)
		case json.Unmarshal(it, &ids) == nil:
			n += len(ids)
		default:
			n++ // a token id: the whole input is one array of ids
		}
	}
	return n
}
