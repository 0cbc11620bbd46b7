package ratecontrol

import (
	"encoding/json"
	"unicode/utf8"
)

// Token estimate heuristic constants.
const (
	estimateCharsPerToken = 4 // ASCII text: ~4 bytes per token (OpenAI/Qwen tokenizers on English)
	estimatePerMessage    = 4 // role and separators per message
	estimatePriming       = 3 // reply priming
)

type chatBody struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
		Name    string          `json:"name"`
	} `json:"messages"`
	Tools json.RawMessage `json:"tools"`
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
// bytes. Non-text parts (images, audio) are not counted. A body that is not
// a chat body counts as text. The Governor's Calibrator corrects the
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
	return n
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
