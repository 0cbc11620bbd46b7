package sim

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// chatRequest is the part of an OpenAI chat-completions body the simulator reads.
type chatRequest struct {
	Model               string        `json:"model"`
	Messages            []chatMessage `json:"messages"`
	MaxTokens           *int64        `json:"max_tokens"`
	MaxCompletionTokens *int64        `json:"max_completion_tokens"`
	Stream              bool          `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	ResponseFormat *responseFormat `json:"response_format"`
}

// chatMessage is what the simulator reads of a message.
type chatMessage struct {
	Role    string      `json:"role"`
	Name    string      `json:"name"`
	Content textContent `json:"content"`
}

// textContent is a message's text: a string content, or the "text" fields
// of content parts concatenated (images and other parts add nothing).
type textContent string

// UnmarshalJSON accepts a string, an array of content parts or null.
func (c *textContent) UnmarshalJSON(b []byte) error {
	switch {
	case len(b) >= 2 && b[0] == '"' && bytes.IndexByte(b, '\\') < 0:
		// The decoder has validated the document: an escape-free string is its bytes.
		*c = textContent(b[1 : len(b)-1])
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = textContent(s)
	case len(b) > 0 && b[0] == '[':
		var parts []struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(b, &parts); err != nil {
			return err
		}
		var sb strings.Builder
		for _, p := range parts {
			sb.WriteString(p.Text)
		}
		*c = textContent(sb.String())
	case string(b) == "null":
		*c = ""
	default:
		return errors.New("content must be a string, an array of parts or null")
	}
	return nil
}

// parsed is a validated request with what the simulator derives from it.
type parsed struct {
	chatRequest
	hash        uint64 // of the messages
	inputTokens int64
}

func parseRequest(body []byte) (parsed, error) {
	var p parsed
	if err := json.Unmarshal(body, &p.chatRequest); err != nil {
		return parsed{}, fmt.Errorf("request body is not a valid chat request: %w", err)
	}
	if p.Model == "" {
		return parsed{}, errors.New("'model' is required")
	}
	if len(p.Messages) == 0 {
		return parsed{}, errors.New("'messages' must be a non-empty array")
	}
	for i, m := range p.Messages {
		if m.Role == "" {
			return parsed{}, fmt.Errorf("messages[%d].role is required", i)
		}
	}
	for _, c := range []*int64{p.MaxTokens, p.MaxCompletionTokens} {
		if c != nil && *c < 1 {
			return parsed{}, fmt.Errorf("max tokens must be at least 1, got %d", *c)
		}
	}
	p.hash = messagesHash(p.Messages)
	p.inputTokens = inputTokens(p.Messages)
	return p, nil
}

// EstimateInputTokens is the simulator's count of a chat request's input
// tokens: 3 + Σ over messages of (4 + ceil(chars/4)), where chars counts the
// runes of the message's text (a string content, or the "text" of its
// content parts). Clients that want to predict the simulator's accounting
// exactly can call it; it returns an error for a body the simulator would
// refuse with 400.
func EstimateInputTokens(requestBody []byte) (int64, error) {
	p, err := parseRequest(requestBody)
	if err != nil {
		return 0, err
	}
	return p.inputTokens, nil
}

func inputTokens(messages []chatMessage) int64 {
	n := int64(3)
	for _, m := range messages {
		chars := int64(utf8.RuneCountInString(string(m.Content)))
		n += 4 + (chars+3)/4
	}
	return n
}

// outputTokens picks the reply length from the mix by the request hash and
// caps it by max_tokens / max_completion_tokens; capped reports the cap bit.
func (p parsed) outputTokens(mix OutputMix) (n int64, capped bool) {
	n = mix.Short
	// Low bits feed the content hash; use the high ones for the draw.
	if float64((p.hash>>32)%10000) < mix.LongShare*10000 {
		n = mix.Long
	}
	for _, c := range []*int64{p.MaxTokens, p.MaxCompletionTokens} {
		if c != nil && *c < n {
			n, capped = *c, true
		}
	}
	return max(n, 1), capped
}

// contentPrefix starts every reply.
const contentPrefix = "llmsim reply "

// content is the reply to the request: structured when its response_format
// asks for JSON (schema.go), else contentFor its hash.
func (p parsed) content() string {
	if c := structuredContent(p.ResponseFormat, p.hash); c != "" {
		return c
	}
	return contentFor(p.hash)
}

func contentFor(hash uint64) string {
	var b [8]byte
	for i := range b {
		b[i] = byte(hash >> (56 - 8*i))
	}
	return contentPrefix + hex.EncodeToString(b[:6])
}

// ExpectedContent is the exact assistant content the simulator replies to
// requestBody (streamed replies concatenate to it): "llmsim reply " and 12
// hex digits of a hash of each message's role, name and text. Key order,
// whitespace, model, max_tokens and the rest of the body are not part of
// it, except a response_format asking for JSON: then it is a JSON value
// generated from that hash and the schema (see schema.go for the subset). A test can check that a stored result belongs to its job with it.
// The reply's usage.completion_tokens comes from the output mix, not from
// this short text. It returns "" when the body is not a valid request.
func ExpectedContent(requestBody []byte) string {
	p, err := parseRequest(requestBody)
	if err != nil {
		return ""
	}
	return p.content()
}

// messagesHash is FNV-1a over each message's role, name and text, each
// followed by a 0xff separator (which UTF-8 text never contains).
func messagesHash(messages []chatMessage) uint64 {
	h := uint64(14695981039346656037)
	for _, m := range messages {
		for _, s := range []string{m.Role, m.Name, string(m.Content)} {
			for i := 0; i < len(s); i++ {
				h ^= uint64(s[i])
				h *= 1099511628211
			}
			h ^= 0xff
			h *= 1099511628211
		}
	}
	return h
}
