package ratecontrol

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/llmq/llmq/internal/jsonscan"
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
//
// It walks the body once (jsonscan) and decodes only the strings it
// counts; a body it cannot read as a chat body counts as text.
func EstimateTokens(requestBody []byte) int {
	if n, ok := estimateChat(requestBody); ok {
		return n
	}
	return textTokens(string(requestBody)) + estimatePriming
}

// estimateChat is EstimateTokens for a chat body: false when body is not
// an object, has no messages, or a message or its role or name is not of
// a chat message's shape.
func estimateChat(body []byte) (int, bool) {
	var messages, tools, search, webSearch []byte
	if !jsonscan.Pick(body, []string{"messages", "tools", "enable_search", "web_search_options"},
		&messages, &tools, &search, &webSearch) {
		return 0, false
	}
	n, count, ok := estimatePriming, 0, true
	if jsonscan.Kind(messages) != '[' || !jsonscan.Elements(messages, func(m []byte) bool {
		count++
		t, shaped := messageTokens(m)
		n += t
		ok = shaped
		return ok
	}) || !ok || count == 0 {
		return 0, false
	}
	if len(tools) > 0 && string(tools) != "null" {
		n += (len(tools) + estimateCharsPerToken - 1) / estimateCharsPerToken
	}
	if turnedOn(search) || turnedOn(webSearch) {
		n += estimateSearch
	}
	return n, true
}

// messageTokens estimates one message: its role, name and text content.
// shaped is false when m is not an object (or null) or its role or name
// not a string (or null).
func messageTokens(m []byte) (n int, shaped bool) {
	switch jsonscan.Kind(m) {
	case 'n':
		return estimatePerMessage, true
	case '{':
	default:
		return 0, false
	}
	// A key named twice counts once, its last value, as a decoder reads it.
	var role, name, content []byte
	if !jsonscan.Pick(m, []string{"role", "name", "content"}, &role, &name, &content) {
		return 0, false
	}
	r, okRole := optionalString(role)
	nm, okName := optionalString(name)
	if !okRole || !okName {
		return 0, false
	}
	n = estimatePerMessage + textTokens(r) + textTokens(nm)
	if s, ok := jsonscan.String(content); ok {
		return n + textTokens(s), true
	}
	return n + partsTokens(content), true
}

// partsTokens counts the text parts of a content array, or nothing when
// one of its parts is not an object (or null) with string (or null) type
// and text.
func partsTokens(content []byte) int {
	n, shaped := 0, true
	walked := jsonscan.Elements(content, func(p []byte) bool {
		switch jsonscan.Kind(p) {
		case 'n':
			return true
		case '{':
		default:
			shaped = false
			return false
		}
		var typ, text []byte
		shaped = jsonscan.Pick(p, []string{"type", "text"}, &typ, &text)
		_, okType := optionalString(typ)
		s, okText := optionalString(text)
		shaped = shaped && okType && okText
		n += textTokens(s)
		return shaped
	})
	if !walked || !shaped {
		return 0
	}
	return n
}

// optionalString is a string field's text: "" for null or absent, false
// for any other kind of value.
func optionalString(v []byte) (string, bool) {
	if k := jsonscan.Kind(v); k == 'n' || k == 0 {
		return "", true
	}
	return jsonscan.String(v)
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
