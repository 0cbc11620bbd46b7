package worker

import (
	"context"
	"fmt"
	"math"

	"github.com/llmq/llmq/internal/config"
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

// Transcriber is what the worker needs of a provider for audio jobs.
type Transcriber interface {
	Transcribe(ctx context.Context, model string, request []byte) (*provider.Response, error)
}

var (
	_ Embedder    = (*provider.Router)(nil)
	_ Transcriber = (*provider.Router)(nil)
)

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
	case job.KindAudio:
		a, ok := w.prov.(Transcriber)
		if !ok {
			return nil, unsupportedKind(k)
		}
		return a.Transcribe(ctx, t.model, t.job.Request)
	case job.KindTask:
		return w.runTask(ctx, t)
	default:
		return nil, unsupportedKind(k)
	}
}

func unsupportedKind(k job.Kind) error {
	return &provider.Error{Class: ratecontrol.Classification{Kind: ratecontrol.KindClient,
		Message: fmt.Sprintf("this consumer's provider does not run %s jobs", k)}}
}

// estimateInput is what t's admission books besides the request: tokens
// (the messages of a chat call, every input of an embeddings batch), or
// for an audio job its audio seconds, the unit its model is metered in
// (GovernorFactory). tokens is the part of it that is tokens, for the
// tenants' token caps and budgets: 0 for audio.
func estimateInput(j *job.Job) (booked, tokens int) {
	switch job.KindOf(j.Kind) {
	case job.KindEmbeddings:
		n := ratecontrol.EstimateEmbeddingTokens(j.Request)
		return n, n
	case job.KindAudio:
		return j.AudioSeconds(), 0
	case job.KindTask:
		return 0, 0 // a task is limited by submissions and running tasks
	}
	n := ratecontrol.EstimateTokens(j.Request)
	return n, n
}

// metered is the usage a successful call of t settles its admission with:
// its tokens, or for an audio job the audio seconds the provider billed
// (as the governor's input, its metered unit).
func metered(t *task, resp *provider.Response) (prompt, completion int) {
	if job.KindOf(t.job.Kind) == job.KindAudio {
		return int(math.Ceil(resp.AudioSeconds)), 0
	}
	return resp.PromptTokens, resp.CompletionTokens
}

// limitsOf are the governor limits of model m, and whether its calls are
// billed on input alone (no output booked). An audio model is metered in
// audio seconds (config.Model.Metered): the governor's per-minute unit
// dimension (auto's window log, window-safe for calls of any size)
// carries them in the place of tokens.
func limitsOf(m config.Model) (ratecontrol.Limits, bool) {
	m = m.Metered()
	lim := ratecontrol.Limits{RPM: m.RPM, TPM: m.TPM, RPS: m.RPS, TPS: m.TPS, MaxConcurrency: m.MaxConcurrency, Warmup: m.Warmup}
	return lim, m.KindOf() != job.KindChat
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
