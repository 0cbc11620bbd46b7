package sim

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"
)

// chatRequest is the part of an OpenAI chat-completions body the simulator reads.
type chatRequest struct {
	Model               string `json:"model"`
	Messages            []any  `json:"messages"`
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	Stream              bool   `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// parsed is a validated request with what the simulator derives from it.
type parsed struct {
	chatRequest
	hash        uint64 // of the canonical messages
	inputTokens int64
}

var errNoMessages = errors.New("'messages' must be a non-empty array")

func parseRequest(body []byte) (parsed, error) {
	var p parsed
	if err := json.Unmarshal(body, &p.chatRequest); err != nil {
		return parsed{}, fmt.Errorf("request body is not valid JSON: %w", err)
	}
	if p.Model == "" {
		return parsed{}, errors.New("'model' is required")
	}
	if len(p.Messages) == 0 {
		return parsed{}, errNoMessages
	}
	for i, msg := range p.Messages {
		m, ok := msg.(map[string]any)
		if !ok {
			return parsed{}, fmt.Errorf("messages[%d] is not an object", i)
		}
		if r, ok := m["role"].(string); !ok || r == "" {
			return parsed{}, fmt.Errorf("messages[%d].role is required", i)
		}
	}
	for _, c := range []*int64{p.MaxTokens, p.MaxCompletionTokens} {
		if c != nil && *c < 1 {
			return parsed{}, fmt.Errorf("max tokens must be at least 1, got %d", *c)
		}
	}
	p.hash = messagesHash(p.Messages)
	p.inputTokens = InputTokens(p.Messages)
	return p, nil
}

// InputTokens is the simulator's estimate of a request's input tokens:
// 3 + Σ over messages of (4 + ceil(chars/4)), where chars counts the runes
// of the message's text content (a string, or the "text" of content parts).
// Clients that want to predict the simulator's accounting can call it on the
// decoded "messages" array.
func InputTokens(messages []any) int64 {
	n := int64(3)
	for _, msg := range messages {
		chars := int64(0)
		if m, ok := msg.(map[string]any); ok {
			switch c := m["content"].(type) {
			case string:
				chars = int64(utf8.RuneCountInString(c))
			case []any:
				for _, part := range c {
					if pm, ok := part.(map[string]any); ok {
						if t, ok := pm["text"].(string); ok {
							chars += int64(utf8.RuneCountInString(t))
						}
					}
				}
			}
		}
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

func contentFor(hash uint64) string {
	var b [8]byte
	for i := range b {
		b[i] = byte(hash >> (56 - 8*i))
	}
	return contentPrefix + hex.EncodeToString(b[:6])
}

// ExpectedContent is the exact assistant content the simulator replies to
// requestBody (streamed replies concatenate to it): "llmsim reply " and 12
// hex digits of a hash of the canonical "messages" (key order and
// whitespace do not matter; model, max_tokens and the rest are not part of
// it). A test can check that a stored result belongs to its job with it.
// The reply's usage.completion_tokens comes from the output mix, not from
// this short text. It returns "" when the body is not a valid request.
func ExpectedContent(requestBody []byte) string {
	p, err := parseRequest(requestBody)
	if err != nil {
		return ""
	}
	return contentFor(p.hash)
}

// messagesHash is FNV-1a over a canonical encoding of the messages.
func messagesHash(messages []any) uint64 {
	h := fnv.New64a()
	buf := make([]byte, 0, 256)
	buf = canon(buf, messages)
	_, _ = h.Write(buf)
	return h.Sum64()
}

// appendString writes a length-prefixed string: unambiguous and cheaper
// than quoting.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// canon appends a canonical encoding of a decoded JSON value.
func canon(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, 'n')
	case bool:
		if x {
			return append(b, 't')
		}
		return append(b, 'f')
	case float64:
		b = append(b, '#')
		if x == math.Trunc(x) && math.Abs(x) < 1e15 {
			return strconv.AppendInt(b, int64(x), 10)
		}
		return strconv.AppendFloat(b, x, 'g', -1, 64)
	case string:
		return appendString(b, x)
	case []any:
		b = append(b, '[')
		for _, e := range x {
			b = canon(b, e)
			b = append(b, ',')
		}
		return append(b, ']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for _, k := range keys {
			b = appendString(b, k)
			b = append(b, ':')
			b = canon(b, x[k])
			b = append(b, ',')
		}
		return append(b, '}')
	default:
		return fmt.Appendf(b, "%v", x)
	}
}
