package store

import (
	"encoding/json"
	"time"

	"github.com/llmq/llmq/internal/job"
)

// ReasonExhausted is the dead-letter reason of a job whose attempts ran out.
const ReasonExhausted = "attempts exhausted"

// JobDeadLetter is the dead letter of job j that ends dead: j as its body
// (nil when j cannot be encoded: the caller supplies the message it read),
// the reason, and what its error history errs says, last being the error
// that ended it. attempt is the attempt that ended; rate-limited attempts
// are given back in the store, so the error entries, one per failed call,
// count the calls made when they are more.
func JobDeadLetter(j job.Job, attempt int, reason string, errs []AttemptError, last AttemptError) DeadLetterRow {
	now := time.Now()
	first := now
	if len(errs) > 0 && !errs[0].At.IsZero() {
		first = errs[0].At
	}
	lastAt := now
	if !last.At.IsZero() {
		lastAt = last.At
	}
	lastErr := last.Message
	if last.Code != "" {
		lastErr = last.Code + ": " + last.Message
	}
	body, _ := json.Marshal(j) // nil when it fails
	return DeadLetterRow{
		Kind: DeadLetterJob, Tenant: j.Tenant, JobID: j.ID, Lane: string(j.Priority), Reason: reason,
		Attempts: max(attempt, len(errs)), LastError: lastErr, Body: body, FirstFailedAt: first, LastFailedAt: lastAt,
	}
}
