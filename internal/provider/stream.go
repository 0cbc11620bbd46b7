package provider

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/llmq/llmq/internal/ratecontrol"
)

// chunk is one SSE event of a streamed chat completion.
type chunk struct {
	ID      string `json:"id"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage          `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// readStream assembles an SSE chat-completion stream into out. onChunk is
// called on every event (it re-arms the idle timer).
func (c *Client) readStream(r io.Reader, out *Response, onChunk func()) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), int(min(c.cfg.MaxBodyBytes, 1<<30)))
	var (
		content strings.Builder
		id      string
		created int64
		model   string
		finish  = "stop"
		u       *usage
		done    bool
	)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		data := bytes.TrimSpace(line[len("data:"):])
		onChunk()
		if bytes.Equal(data, []byte("[DONE]")) {
			done = true
			break
		}
		var ch chunk
		if err := json.Unmarshal(data, &ch); err != nil {
			return c.fail(ratecontrol.Classification{Kind: ratecontrol.KindServer, Status: http.StatusOK, Message: "malformed stream chunk"}, nil, 0)
		}
		if len(ch.Error) > 0 && !bytes.Equal(ch.Error, []byte("null")) {
			// An error inside the stream: classify it like an error body.
			return c.fail(ratecontrol.Classify(http.StatusInternalServerError, nil, c.scrubBytes(data)), nil, 0)
		}
		if ch.ID != "" {
			id, created, model = ch.ID, ch.Created, ch.Model
		}
		for _, choice := range ch.Choices {
			if choice.Index != 0 {
				continue
			}
			content.WriteString(choice.Delta.Content)
			if int64(content.Len()) > c.cfg.MaxBodyBytes {
				return c.fail(ratecontrol.Classification{Kind: ratecontrol.KindServer, Status: http.StatusOK, Message: errTooLarge.Error()}, nil, 0)
			}
			if choice.FinishReason != nil {
				finish = *choice.FinishReason
			}
		}
		if ch.Usage != nil {
			u = ch.Usage
		}
	}
	if err := sc.Err(); err != nil {
		if err == bufio.ErrTooLong {
			return c.fail(ratecontrol.Classification{Kind: ratecontrol.KindServer, Status: http.StatusOK, Message: errTooLarge.Error()}, nil, 0)
		}
		return err
	}
	if !done {
		return io.ErrUnexpectedEOF
	}
	if model == "" {
		model = out.Model
	}
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Message      message `json:"message"`
		FinishReason string  `json:"finish_reason"`
	}
	assembled := struct {
		ID      string   `json:"id"`
		Object  string   `json:"object"`
		Created int64    `json:"created"`
		Model   string   `json:"model"`
		Choices []choice `json:"choices"`
		Usage   *usage   `json:"usage,omitempty"`
	}{id, "chat.completion", created, model, []choice{{0, message{"assistant", content.String()}, finish}}, u}
	body, err := json.Marshal(assembled)
	if err != nil {
		return err
	}
	out.Body = body
	out.Content = content.String()
	if u != nil {
		out.PromptTokens, out.CompletionTokens = u.PromptTokens, u.CompletionTokens
	}
	return nil
}
