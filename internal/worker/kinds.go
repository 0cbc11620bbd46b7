package worker

import (
	"context"
	"fmt"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/ratecontrol"
)

// Embedder is what the worker needs of a provider for embeddings jobs
// (provider.Router and provider.Client have it). A Provider without it
// fails such jobs as the client's error.
type Embedder interface {
	Embeddings(ctx context.Context, model string, request []byte) (*provider.Response, error)
}

var _ Embedder = (*provider.Router)(nil)

// send makes the call of t's kind on t.model (docs/design.md#kinds). Every
// kind answers with a provider.Response whose body is stored as the job's
// response, and whose usage settles the admission.
func (w *Worker) send(ctx context.Context, t *task) (*provider.Response, error) {
	switch k := job.KindOf(t.job.Kind); k {
	case job.KindChat:
		return w.prov.Chat(ctx, t.model, t.job.Request)
	case job.KindEmbeddings:
		e, ok := w.prov.(Embedder)
		if !ok {
			return nil, unsupportedKind(k)
		}
		return e.Embeddings(ctx, t.model, t.job.Request)
	default:
		return nil, unsupportedKind(k)
	}
}

func unsupportedKind(k job.Kind) error {
	return &provider.Error{Class: ratecontrol.Classification{Kind: ratecontrol.KindClient,
		Message: fmt.Sprintf("this consumer's provider does not run %s jobs", k)}}
}

// estimateInput is the input-token estimate t's admission books: the
// messages of a chat call, every input of an embeddings batch.
func estimateInput(j *job.Job) int {
	if job.KindOf(j.Kind) == job.KindEmbeddings {
		return ratecontrol.EstimateEmbeddingTokens(j.Request)
	}
	return ratecontrol.EstimateTokens(j.Request)
}

// kindMismatch says why the configured model cannot serve j's kind (the
// configuration changed since the job was accepted), or "".
func (w *Worker) kindMismatch(j *job.Job) string {
	mc, ok := w.cfg.Models[j.Model]
	if !ok || mc.KindOf() == job.KindOf(j.Kind) {
		return ""
	}
	return fmt.Sprintf("model %q serves %s jobs, not %s jobs", j.Model, mc.KindOf(), job.KindOf(j.Kind))
}
