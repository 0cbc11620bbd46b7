package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// reply is an admitted request's answer.
type reply struct {
	id, model, content string
	created            int64
	in, out            int64
	capped             bool
}

type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

type message struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type choice struct {
	Index        int      `json:"index"`
	Message      *message `json:"message,omitempty"`
	Delta        *message `json:"delta,omitempty"`
	FinishReason *string  `json:"finish_reason"`
}

type completion struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage,omitempty"`
}

func (r reply) finishReason() *string {
	f := "stop"
	if r.capped {
		f = "length"
	}
	return &f
}

func (r reply) usage() *usage {
	return &usage{PromptTokens: r.in, CompletionTokens: r.out, TotalTokens: r.in + r.out}
}

func (r reply) completion() completion {
	return completion{ID: r.id, Object: "chat.completion", Created: r.created, Model: r.model,
		Choices: []choice{{Message: &message{Role: "assistant", Content: r.content}, FinishReason: r.finishReason()}},
		Usage:   r.usage()}
}

// streamPieces is how many content chunks a streamed reply has at most.
const streamPieces = 4

// stream sends the reply as server-sent events: content chunks paced by the
// latency model (TTFT, then TPT per token), a final chunk with the finish
// reason, a usage chunk when asked for, and "data: [DONE]".
func (s *Simulator) stream(ctx context.Context, w http.ResponseWriter, r reply, includeUsage bool, ttft, tpt time.Duration) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	send := func(c completion) {
		b, _ := json.Marshal(c) // plain structs: cannot fail
		_, _ = w.Write([]byte("data: "))
		_, _ = w.Write(b)
		_, _ = w.Write([]byte("\n\n"))
		if flusher != nil {
			flusher.Flush()
		}
	}
	chunk := func(d *message, finish *string) completion {
		return completion{ID: r.id, Object: "chat.completion.chunk", Created: r.created, Model: r.model,
			Choices: []choice{{Delta: d, FinishReason: finish}}}
	}
	if !s.sleep(ctx, ttft) {
		return
	}
	pieces := int(min(int64(streamPieces), r.out, int64(len(r.content))))
	size := (len(r.content) + pieces - 1) / pieces
	left := r.out
	for i := range pieces {
		part := r.content[i*size : min(len(r.content), (i+1)*size)]
		tokens := left / int64(pieces-i)
		left -= tokens
		if !s.sleep(ctx, time.Duration(tokens)*tpt) {
			return
		}
		d := &message{Content: part}
		if i == 0 {
			d.Role = "assistant"
		}
		send(chunk(d, nil))
	}
	send(chunk(&message{}, r.finishReason()))
	if includeUsage {
		send(completion{ID: r.id, Object: "chat.completion.chunk", Created: r.created, Model: r.model,
			Choices: []choice{}, Usage: r.usage()})
	}
	_, _ = w.Write([]byte("data: [DONE]\n\n"))
	if flusher != nil {
		flusher.Flush()
	}
}
