package worker

import (
	"slices"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/store"
)

// rateLimitKinds are the stored names (Kind.String) of the rate-limited kinds.
var rateLimitKinds = func() map[string]bool {
	out := map[string]bool{}
	for k := ratecontrol.KindOK; k <= ratecontrol.KindCanceled; k++ {
		if k.RateLimited() {
			out[k.String()] = true
		}
	}
	return out
}()

// isRateLimitKind reports whether a stored attempt error was a 429.
func isRateLimitKind(kind string) bool { return rateLimitKinds[kind] }

// count429 counts the job's stored 429s on model.
func count429(errs []store.AttemptError, model string) int {
	n := 0
	for _, e := range errs {
		if e.Model == model && isRateLimitKind(e.Kind) {
			n++
		}
	}
	return n
}

// countFailures counts the attempts that used up max_attempts: every
// failure except rate limiting and hand-backs.
func countFailures(errs []store.AttemptError) int {
	n := 0
	for _, e := range errs {
		if !isRateLimitKind(e.Kind) {
			n++
		}
	}
	return n
}

// maxAttempts is the job's budget as the store holds it.
func maxAttempts(t *task) int {
	if t.rec.MaxAttempts > 0 {
		return t.rec.MaxAttempts
	}
	return t.job.MaxAttempts
}

// candidates lists the models a job may run on, in order: its own model,
// then its fallback_models or else the model's configured fallback chain,
// keeping only models of the job's kind (an embeddings job never falls back
// to a chat model) whose declared capabilities cover what the job needs.
// Falling back is only ever decided on 429s (see chooseModel).
func (w *Worker) candidates(j *job.Job) []string {
	out := []string{j.Model}
	chain := j.FallbackModels
	if len(chain) == 0 {
		chain = w.cfg.Models[j.Model].Fallback
	}
	need := j.RequiredCapabilities()
	for _, m := range chain {
		if slices.Contains(out, m) {
			continue
		}
		if len(w.cfg.Models) > 0 {
			mc, ok := w.cfg.Models[m]
			if !ok || mc.KindOf() != job.KindOf(j.Kind) || !covers(mc.Capabilities, need) {
				continue
			}
		} else if len(need) > 0 {
			continue // capabilities unknown: usable only by jobs that need none
		}
		out = append(out, m)
	}
	return out
}

func covers(have, need []string) bool {
	for _, n := range need {
		if !slices.Contains(have, n) {
			return false
		}
	}
	return true
}

// chooseModel picks the model of the next attempt from the job's error
// history: the first candidate with fewer than FallbackAfter429 429s, or,
// when every candidate has had that many, the one with the fewest.
func (w *Worker) chooseModel(j *job.Job, errs []store.AttemptError) string {
	cands := w.candidates(j)
	best, bestN := cands[0], -1
	for _, m := range cands {
		n := count429(errs, m)
		if n < w.cfg.FallbackAfter429 {
			return m
		}
		if bestN < 0 || n < bestN {
			best, bestN = m, n
		}
	}
	return best
}
