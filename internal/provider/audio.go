package provider

import (
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/llmq/llmq/internal/ratecontrol"
)

// Transcribe sends request (a JSON transcription body: the audio and its
// duration_seconds, docs/design.md#kinds) for model to BaseURL +
// "/audio/transcriptions", never streamed, and returns the provider's body
// with the audio seconds it billed as AudioSeconds (usage.seconds, else
// duration), or an *Error.
func (c *Client) Transcribe(ctx context.Context, model string, request []byte) (*Response, error) {
	return c.postUnary(ctx, c.audioURL, model, request, c.readTranscription)
}

func (c *Client) readTranscription(r io.Reader, out *Response) error {
	data, err := c.readCapped(r)
	if err != nil {
		return err
	}
	var parsed struct {
		Text     *string `json:"text"`
		Duration float64 `json:"duration"`
		Usage    *struct {
			Seconds float64 `json:"seconds"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &parsed); err != nil || parsed.Text == nil {
		return c.fail(ratecontrol.Classification{Kind: ratecontrol.KindServer, Status: http.StatusOK, Message: "malformed transcription body"}, nil, 0)
	}
	out.Body = data
	out.AudioSeconds = parsed.Duration
	if parsed.Usage != nil && parsed.Usage.Seconds > 0 {
		out.AudioSeconds = parsed.Usage.Seconds
	}
	return nil
}
