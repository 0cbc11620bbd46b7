package ratecontrol

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// Token estimate heuristic constants.
const (
	estimateCharsPerToken = 4 // ASCII text: ~4 bytes per token (OpenAI/Qwen tokenizers on English)
	estimatePerMessage    = 4 // role and separators per message
	estimatePriming       = 3 // reply priming
	// estimateSearch is what a web search adds to the prompt: the provider
	// injects the results as input tokens (DashScope's enable_search, a
	// few thousand tokens per search). A prior only; the Calibrator
	// corrects it per model from prompt_tokens.
	estimateSearch = 2000
)

type chatBody struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
		Name    string          `json:"name"`
	} `json:"messages"`
	Tools json.RawMessage `json:"tools"`
	// Fields that add search results to the prompt, when allowed
	// (limits.request_fields).
	EnableSearch     json.RawMessage `json:"enable_search"`
	WebSearchOptions json.RawMessage `json:"web_search_options"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// EstimateTokens estimates the input tokens of an OpenAI chat-completions
// body without a tokenizer: ASCII text counts 1 token per 4 bytes, every
// other rune (CJK and the like) 1 token each — Qwen and GPT tokenizers
// spend about one token per Chinese character, so this errs high —, plus 4
// tokens per message, 3 for priming, and the tools JSON at 1 token per 4
// bytes, and estimateSearch when it asks for a web search (enable_search,
// web_search_options). Non-text parts (images, audio) are not counted; n
// does not count here, since the prompt is billed once for every choice
// (the output side, job.MaxTokens, multiplies by n). A body that is not a
// chat body counts as text. The Governor's Calibrator corrects the
// systematic error per model from the provider's prompt_tokens.
func EstimateTokens(requestBody []byte) int {
	var b chatBody
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

// turnedOn reports whether a request field asks for something: set, and
// neither null nor false.
func turnedOn(raw json.RawMessage) bool {
	s := string(bytes.TrimSpace(raw))
	return s != "" && s != "null" && s != "false"
}

func textTokens(s string) int {
	ascii, other := 0, 0
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			ascii++
			i++
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		other++
		i += size
	}
	return (ascii+estimateCharsPerToken-1)/estimateCharsPerToken + other
}
