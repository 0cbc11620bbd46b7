package provider

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/llmq/llmq/internal/jsonscan"
)

// chatBody is what a call keeps of a chat.completion body besides the body
// itself: the first choice's text and the usage.
type chatBody struct {
	content              string
	prompt, completion   int
	hasUsage, hasChoices bool
}

// readChatBody reads data as encoding/json decodes it into readBody's
// struct, and reports false where that decode fails. The common body
// (an object with a choices array of objects whose message content is a
// string, and integer usage counts) is walked once by jsonscan; anything
// else goes to encoding/json, so both answer alike on every input
// (FuzzChatBodyAgreesWithDecoder). Decoding every answer with
// encoding/json was ~6% of a consumer's CPU in the side-by-side
// (BENCHMARKS.md, "The provider's answer read once").
func readChatBody(data []byte) (chatBody, bool) {
	if b, ok := scanChatBody(data); ok {
		return b, true
	}
	return decodeChatBody(data)
}

// decodeChatBody is the decoder's reading, the reference scanChatBody
// agrees with.
func decodeChatBody(data []byte) (chatBody, bool) {
	var parsed struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage *usage `json:"usage"`
	}
	if err := json.Unmarshal(data, &parsed); err != nil {
		return chatBody{}, false
	}
	b := chatBody{hasChoices: len(parsed.Choices) > 0}
	if b.hasChoices {
		b.content = parsed.Choices[0].Message.Content
	}
	if parsed.Usage != nil {
		b.hasUsage = true
		b.prompt, b.completion = parsed.Usage.PromptTokens, parsed.Usage.CompletionTokens
	}
	return b, true
}

// scanChatBody is the walk of the common body; false means "ask the
// decoder", never "malformed". It gives up on what the decoder reads in
// ways of its own: a key that matches a field only without regard to case,
// a key twice (the decoder fails on the first value's type even though
// the last one wins), a null where an object or string is expected, a
// count that is not a plain integer. A value not of the expected kind (an
// object, an array) fails the walk that reads it: jsonscan walks only
// what opens as it expects.
func scanChatBody(data []byte) (chatBody, bool) {
	if !jsonscan.Valid(data) {
		return chatBody{}, false
	}
	var b chatBody
	var choices, use []byte
	if !members(data, []string{"choices", "usage"}, &choices, &use) {
		return chatBody{}, false
	}
	if choices != nil {
		plain := true
		walked := jsonscan.Elements(choices, func(elem []byte) bool {
			content, ok := choiceContent(elem)
			if ok && !b.hasChoices {
				b.content, b.hasChoices = content, true
			}
			plain = ok
			return ok
		})
		if !walked || !plain {
			return chatBody{}, false
		}
	}
	if use != nil {
		var prompt, completion, total []byte
		if !members(use, []string{"prompt_tokens", "completion_tokens", "total_tokens"}, &prompt, &completion, &total) {
			return chatBody{}, false
		}
		var ok1, ok2, ok3 bool
		b.prompt, ok1 = count(prompt)
		b.completion, ok2 = count(completion)
		_, ok3 = count(total)
		if !ok1 || !ok2 || !ok3 {
			return chatBody{}, false
		}
		b.hasUsage = true
	}
	return b, true
}

// choiceContent is the message content of one element of choices: an
// object whose message, if any, is an object whose content, if any, is a
// string.
func choiceContent(elem []byte) (string, bool) {
	var msg, content []byte
	if !members(elem, []string{"message"}, &msg) {
		return "", false
	}
	if msg == nil {
		return "", true
	}
	if !members(msg, []string{"content"}, &content) {
		return "", false
	}
	if content == nil {
		return "", true
	}
	return jsonscan.String(content)
}

// members is jsonscan.Pick that fails on a key of keys met twice, and on
// a key equal to one of keys only without regard to case, which the
// decoder would take for it.
func members(obj []byte, keys []string, vals ...*[]byte) bool {
	plain := true
	walked := jsonscan.MemberBytes(obj, func(k, v []byte) bool {
		for i, key := range keys {
			if string(k) == key && *vals[i] == nil {
				*vals[i] = v
				return true
			}
			if strings.EqualFold(string(k), key) {
				plain = false
				return false
			}
		}
		return true
	})
	return walked && plain
}

// count reads a token count of a valid body as the decoder reads it into
// an int: absent is 0, an integer that fits is itself; anything else (null,
// a fraction, an exponent, a string, too many digits) is for the decoder.
func count(raw []byte) (int, bool) {
	if raw == nil {
		return 0, true
	}
	n, err := strconv.Atoi(string(raw))
	return n, err == nil
}
