package job

import "fmt"

// Status is a job's public lifecycle state, as GET /v1/jobs/{id} reports it.
//
//	queued ──► running ──► succeeded
//	  ▲  │        │ ├────► failed     (permanent error, e.g. 4xx)
//	  │  ├────────┼─┼────► failed     (from queued: a model no longer configured)
//	  │  │        │ ├────► retrying ──► running …
//	  │  │        │ ├────► dead       (attempts exhausted or deadline passed; in the DLQ)
//	  │  │        │ ├────► queued     (lease expired or handed back on shutdown)
//	  │  │        │ └────► batched ──► succeeded, retrying, cancelled
//	  │  │        │                    (offloaded to a provider batch)
//	  │  └────────┴──────► cancelled
//	  └── dead, failed    (replay from the DLQ)
type Status string

const (
	StatusQueued   Status = "queued"
	StatusRunning  Status = "running"
	StatusRetrying Status = "retrying"
	// StatusBatched: acked off the broker and waiting in, or for, a
	// provider batch (docs/design.md#batch-offload); the reconciler leaves
	// it alone.
	StatusBatched   Status = "batched"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusDead      Status = "dead"
	StatusCancelled Status = "cancelled"
)

// Statuses lists every status in lifecycle order.
var Statuses = []Status{StatusQueued, StatusRunning, StatusRetrying, StatusBatched, StatusSucceeded, StatusFailed, StatusDead, StatusCancelled}

// transitions is the single source of truth for allowed moves. The store
// derives its SQL guards from it (AllowedFrom), so Go and the database agree.
var transitions = map[Status][]Status{
	StatusQueued:    {StatusRunning, StatusCancelled, StatusDead, StatusFailed},
	StatusRunning:   {StatusSucceeded, StatusFailed, StatusRetrying, StatusDead, StatusQueued, StatusCancelled, StatusBatched},
	StatusRetrying:  {StatusRunning, StatusCancelled, StatusDead, StatusQueued},
	StatusBatched:   {StatusSucceeded, StatusRetrying, StatusCancelled},
	StatusSucceeded: nil,
	StatusFailed:    {StatusQueued},
	StatusDead:      {StatusQueued},
	StatusCancelled: nil,
}

// Valid reports whether s is one of the public statuses.
func (s Status) Valid() bool {
	_, ok := transitions[s]
	return ok
}

// Terminal reports whether no work remains for a job in status s. Failed and
// dead jobs are terminal although an operator may replay them.
func (s Status) Terminal() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusDead, StatusCancelled:
		return true
	}
	return false
}

// CanTransition reports whether a job may move from one status to another.
func CanTransition(from, to Status) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// AllowedFrom returns every status from which a job may move to `to`, in
// lifecycle order. Store guards use it as `WHERE status = ANY(AllowedFrom(to))`.
func AllowedFrom(to Status) []Status {
	var out []Status
	for _, from := range Statuses {
		if CanTransition(from, to) {
			out = append(out, from)
		}
	}
	return out
}

// TransitionError reports a refused state change.
type TransitionError struct {
	From, To Status
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("job status %s cannot move to %s", e.From, e.To)
}

// Transition returns nil if from → to is allowed, else a *TransitionError.
func Transition(from, to Status) error {
	if !CanTransition(from, to) {
		return &TransitionError{From: from, To: to}
	}
	return nil
}
