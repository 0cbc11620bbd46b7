package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// AttemptLogEntry is one attempt of a job's timeline (the attempt_log
// column, migrations/00027_console.sql): every attempt leaves one, whether
// it succeeded or not, appended by the statement that ends it.
type AttemptLogEntry struct {
	Attempt int    `json:"attempt"`
	Model   string `json:"model,omitempty"`
	// Outcome is how the attempt ended: OutcomeSucceeded, OutcomeRateLimited,
	// OutcomeCancelled, OutcomeLeaseExpired, or the error's kind for any
	// other failure (server, transient, client, invalid, deadline, …;
	// docs/design.md#classification).
	Outcome string `json:"outcome"`
	// Kind is the error's precise class (rate_limit_tokens, …); empty on a
	// success.
	Kind       string `json:"kind,omitempty"`
	HTTPStatus int    `json:"http_status,omitempty"`
	Code       string `json:"code,omitempty"`
	// Message is the error as stored in the job's errors (provider keys
	// are redacted before it gets here, ratecontrol.Classification).
	Message string `json:"message,omitempty"`
	// ClaimedAt is when the worker claimed the job for this attempt;
	// StartedAt and EndedAt bound the provider call (StartedAt is nil when
	// no call went out).
	ClaimedAt        *time.Time `json:"claimed_at,omitempty"`
	StartedAt        *time.Time `json:"started_at,omitempty"`
	EndedAt          time.Time  `json:"ended_at"`
	PromptTokens     int        `json:"prompt_tokens,omitempty"`
	CompletionTokens int        `json:"completion_tokens,omitempty"`
}

// Outcomes of an attempt that are not an error kind.
const (
	OutcomeSucceeded    = "succeeded"
	OutcomeRateLimited  = "rate_limited"
	OutcomeCancelled    = "cancelled"
	OutcomeLeaseExpired = "lease_expired"
)

// Trace is what the worker saw of an attempt besides its outcome, for the
// job's attempt log. Zero times are left out of the entry (EndedAt: now).
type Trace struct {
	ClaimedAt     time.Time
	CallStartedAt time.Time
	CallEndedAt   time.Time
	HTTPStatus    int
}

func optionalTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC().Round(time.Microsecond)
	return &u
}

// entryOf is the log entry of an attempt that ended with e.
func (tr Trace) entryOf(e AttemptError) AttemptLogEntry {
	out := AttemptLogEntry{Attempt: e.Attempt, Model: e.Model, Outcome: e.Kind, Kind: e.Kind,
		HTTPStatus: tr.HTTPStatus, Code: e.Code, Message: e.Message}
	if e.Call == CallRateLimited {
		out.Outcome = OutcomeRateLimited
	}
	tr.stamp(&out, e.At)
	return out
}

// successOf is the log entry of the attempt a that stored r.
func (tr Trace) successOf(a Attempt, r Result) AttemptLogEntry {
	out := AttemptLogEntry{Attempt: a.N, Model: r.ModelUsed, Outcome: OutcomeSucceeded, HTTPStatus: tr.HTTPStatus,
		PromptTokens: r.PromptTokens, CompletionTokens: r.CompletionTokens}
	tr.stamp(&out, time.Time{})
	return out
}

// stamp sets the entry's times: the call's end, else fallback, else now.
func (tr Trace) stamp(e *AttemptLogEntry, fallback time.Time) {
	e.ClaimedAt, e.StartedAt = optionalTime(tr.ClaimedAt), optionalTime(tr.CallStartedAt)
	end := tr.CallEndedAt
	if end.IsZero() {
		end = fallback
	}
	if end.IsZero() {
		end = time.Now()
	}
	e.EndedAt = end.UTC().Round(time.Microsecond)
}

// logEntry encodes e as a one-element JSON array for `attempt_log || $n`.
func logEntry(e AttemptLogEntry) string {
	if len(e.Message) > maxErrorMessage {
		e.Message = truncateUTF8(e.Message, maxErrorMessage)
	}
	e.Message, e.Code = storableText(e.Message), storableText(e.Code)
	b := make([]byte, 0, 256)
	b = appendLogEntry(append(b, '['), e)
	return string(append(b, ']'))
}

// endedBySQL is the entry a statement that ends a running attempt for its
// worker appends (Cancel, a lease takeover): the attempt number, the
// outcome and the end time are all the row knows.
func endedBySQL(outcome, endedAt string) string {
	return `jsonb_build_array(jsonb_build_object('attempt', jobs.attempts, 'outcome', '` + outcome +
		`', 'ended_at', to_char(` + endedAt + ` AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))`
}

// AttemptLog returns the job's attempt log, oldest first; ErrNotFound if
// there is no such job. It is read apart from the row (jobColumns leaves
// it out) so that claims and lists do not carry it.
func (s *Store) AttemptLog(ctx context.Context, key job.Key) ([]AttemptLogEntry, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var raw []byte
	err := s.pool.QueryRow(ctx, `SELECT attempt_log FROM jobs WHERE tenant = $1 AND id = $2`, key.Tenant, key.ID).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("attempt log of job %s: %w", key.ID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("attempt log of job %s: %w", key.ID, err)
	}
	out := []AttemptLogEntry{}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("attempt log of job %s: decode: %w", key.ID, err)
	}
	return out, nil
}
