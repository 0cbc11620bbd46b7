package provider

import (
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/llmq/llmq/internal/ratecontrol"
)

// Embeddings sends request (an OpenAI embeddings body: input, dimensions,
// …) for model to BaseURL + "/embeddings", never streamed, and returns the
// list object as Body with the input tokens the provider counted as
// PromptTokens (embeddings have no output), or an *Error.
func (c *Client) Embeddings(ctx context.Context, model string, request []byte) (*Response, error) {
	return c.postUnary(ctx, c.embeddingsURL, model, request, c.readEmbeddings)
}

// postUnary posts request, with its model set, to url, never streamed (an
// embeddings or transcription call), and reads the answer with read.
func (c *Client) postUnary(ctx context.Context, url, model string, request []byte, read func(io.Reader, *Response) error) (*Response, error) {
	modelJSON, _ := json.Marshal(model)
	body, err := SetTopLevel(request, "model", modelJSON)
	if err != nil {
		return nil, c.fail(ratecontrol.Classification{Kind: ratecontrol.KindClient, Message: err.Error()}, nil, 0)
	}
	return c.post(ctx, url, model, body, false, read)
}

func (c *Client) readEmbeddings(r io.Reader, out *Response) error {
	data, err := c.readCapped(r)
	if err != nil {
		return err
	}
	var parsed struct {
		Data  []json.RawMessage `json:"data"`
		Usage *usage            `json:"usage"`
	}
	if err := json.Unmarshal(data, &parsed); err != nil || len(parsed.Data) == 0 {
		return c.fail(ratecontrol.Classification{Kind: ratecontrol.KindServer, Status: http.StatusOK, Message: "malformed embeddings body"}, nil, 0)
	}
	out.Body = data
	if parsed.Usage != nil {
		out.PromptTokens = parsed.Usage.PromptTokens
		if out.PromptTokens == 0 {
			out.PromptTokens = parsed.Usage.TotalTokens
		}
	}
	return nil
}
