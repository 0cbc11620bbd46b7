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

// SubmitTask submits a task of model on its provider's native API.
func (r *Router) SubmitTask(ctx context.Context, model, endpoint string, request []byte) (string, error) {
	rt, err := r.route(model)
	if err != nil {
		return "", err
	}
	return rt.Client.SubmitTask(ctx, rt.Upstream, endpoint, request)
}

// PollTask reads a task of model's provider.
func (r *Router) PollTask(ctx context.Context, model, id string) (string, *Response, error) {
	rt, err := r.route(model)
	if err != nil {
		return "", nil, err
	}
	status, resp, err := rt.Client.PollTask(ctx, rt.Upstream, id)
	if resp != nil {
		resp.Model = model
	}
	return status, resp, err
}

func (r *Router) call(ctx context.Context, model string, request []byte,
	send func(*Client, context.Context, string, []byte) (*Response, error)) (*Response, error) {
	rt, err := r.route(model)
	if err != nil {
		return nil, err
	}
	resp, err := send(rt.Client, ctx, rt.Upstream, request)
	if resp != nil {
		resp.Model = model
	}
	return resp, err
}

// route is model's route; a model without one is the unlisted client's.
func (r *Router) route(model string) (Route, error) {
	rt, ok := r.routes[model]
	if !ok {
		if r.unlisted == nil {
			// Validation refuses such jobs; one that slips through fails
			// instead of going to some provider.
			return Route{}, &Error{Class: ratecontrol.Classification{Kind: ratecontrol.KindClient,
				Message: fmt.Sprintf("model %q has no provider", model)}}
		}
		rt = Route{Client: r.unlisted, Upstream: model}
	}
	return rt, nil
}
