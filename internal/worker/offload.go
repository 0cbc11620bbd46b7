package worker

import (
	"context"
	"time"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// Batch offload (docs/design.md#batch-offload): a claimed job of a model
// whose batch: section covers its lane, and whose deadline leaves the
// completion window plus the margin, is not called: its attempt becomes
// batched in Postgres, and only then is its delivery acked, so no delivery
// is held while a batch runs (RabbitMQ cancels a consumer that keeps one
// for 30 minutes). internal/offload takes it from there. Both ways in (a
// lane delivery and the direct intake) pass through route, and so here.

// Offloading is what the worker needs from the store to offload jobs; a
// Store without it never offloads.
type Offloading interface {
	MarkBatched(ctx context.Context, a store.Attempt) (bool, error)
}

var _ Offloading = (*store.Store)(nil)

// offloads reports whether t's job goes to a batch instead of a call.
func (w *Worker) offloads(t *task) bool {
	if w.offloading == nil || job.KindOf(t.job.Kind) != job.KindChat {
		return false
	}
	b := w.cfg.Models[t.job.Model].Batch
	if !b.Offloads(string(t.job.Priority)) {
		return false
	}
	// A job a batch sent back (failed line, expiry, deadline near) runs
	// online from then on.
	for _, e := range t.rec.Errors {
		if e.Kind == store.KindBatch {
			return false
		}
	}
	if dl := t.job.Deadline; dl != nil && time.Until(*dl) < b.CompletionWindow+b.Margin {
		return false
	}
	return true
}

// markBatched hands t's job to the batch coordinator and acks.
func (w *Worker) markBatched(t *task) {
	if !w.written(t) {
		return
	}
	ok, err := w.offloading.MarkBatched(w.bg, w.held(t))
	if !w.transitioned(t, "mark job batched", ok, err) {
		return
	}
	w.metrics.jobs.WithLabelValues("batched").Inc()
	w.traceOutcome(t, "batched")
	w.ack(t)
}
