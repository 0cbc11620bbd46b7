package provider

import (
	"context"
	"fmt"

	"github.com/llmq/llmq/internal/ratecontrol"
)

// Route is where one llmq model's calls go: its provider's client and the
// model's name there.
type Route struct {
	Client   *Client
	Upstream string
}

// Router sends each llmq model (a key of config's models:) to its route,
// so one consumer calls several providers and a fallback chain may cross
// them (docs/design.md#providers). Safe for concurrent use; it owns no
// client (Close them yourself).
type Router struct {
	routes map[string]Route
	// unlisted serves models without a route under their own name: llmq
	// runs with no models: configured on the default provider alone.
	unlisted *Client
}

// NewRouter returns a router over routes; unlisted, when not nil, serves
// every other model under its own name.
func NewRouter(routes map[string]Route, unlisted *Client) *Router {
	return &Router{routes: routes, unlisted: unlisted}
}

// Chat calls model's provider with its upstream name. The Response's Model
// is the llmq model; the body holds what the provider answered.
func (r *Router) Chat(ctx context.Context, model string, request []byte) (*Response, error) {
	return r.call(ctx, model, request, (*Client).Chat)
}

// Embeddings is Chat for embeddings requests.
func (r *Router) Embeddings(ctx context.Context, model string, request []byte) (*Response, error) {
	return r.call(ctx, model, request, (*Client).Embeddings)
}

// Transcribe is Chat for audio transcription requests.
func (r *Router) Transcribe(ctx context.Context, model string, request []byte) (*Response, error) {
	return r.call(ctx, model, request, (*Client).Transcribe)
}

func (r *Router) call(ctx context.Context, model string, request []byte,
	send func(*Client, context.Context, string, []byte) (*Response, error)) (*Response, error) {
	rt, ok := r.routes[model]
	if !ok {
		if r.unlisted == nil {
			// Validation refuses such jobs; one that slips through fails
			// instead of going to some provider.
			return nil, &Error{Class: ratecontrol.Classification{Kind: ratecontrol.KindClient,
				Message: fmt.Sprintf("model %q has no provider", model)}}
		}
		rt = Route{Client: r.unlisted, Upstream: model}
	}
	resp, err := send(rt.Client, ctx, rt.Upstream, request)
	if resp != nil {
		resp.Model = model
	}
	return resp, err
}
