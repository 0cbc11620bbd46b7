// Package store is llmq's Postgres store (pgx/v5) and the only writer of job
// rows and dead letters. The schema lives in the migrations package and is
// applied by Migrate.
//
// One record of every job. A job's row is written when llmq accepts it (the
// API's InsertBatch, or the ingester's for a message published to the
// intake), before any worker can see it; a broker message only wakes a
// worker, which claims the row by key (Claim, ClaimBatch) and runs the
// stored job. enqueued_at records whether a message for the row exists
// (MarkEnqueued, MarkUnenqueued), and Unenqueued and Stale find the rows
// whose message is missing or lost for the reconciler. A message refused
// at intake still leaves a record (RecordIntakeFailure): a failed row under
// its id and its body as a dead letter.
//
// Every state change is one guarded statement,
//
//	UPDATE jobs SET status = <to>, … WHERE … AND status = ANY(<job.AllowedFrom(to)>)
//
// so the database, not Go code, refuses a move the transition table of
// package job does not allow; CHECK constraints tie each status to the
// fields it implies (a running job has a lease, a succeeded one a response,
// a terminal one completed_at). A result is written once: Complete only
// succeeds for the running attempt that holds the lease.
//
// Attempts. attempts counts claims: Claim (and ClaimBatch) increments it
// and returns the attempt number. The methods that end an attempt
// (Complete, CompleteBatch, Fail, ScheduleRetry, DeferRateLimited,
// MarkDead, MarkDeadLettered) take an Attempt naming the job, the owner
// that claimed it and that number (Claim.AttemptOf), and succeed only while
// that claim still holds. A running job whose lease expired may be claimed
// again by another owner (lease takeover, attempt+1); once attempts reach
// max_attempts such a job is moved to dead instead (ClaimOutcome
// Exhausted). Release hands a running job back to queued and gives its
// attempt back (attempts-1): the caller releases only attempts that never
// reached the provider. Replay moves a dead or failed job back to queued
// with attempts reset to 0; the error history is kept. Requeue moves a due
// retrying job, or a running one whose lease expired, back to queued
// (attempts kept) for a sweeper. Claim does not look at a job's deadline:
// the caller checks it and ends the attempt with MarkDeadLettered (or
// MarkDead).
//
// Batches. ClaimBatch and CompleteBatch are one statement each (arrays
// through unnest), with per-item results equal to the single calls; rows
// are taken in (tenant, id) order so concurrent batches do not deadlock.
//
// Not found vs refused. The methods that end an attempt, and Release and
// Requeue, answer false when their guard matches no row, whatever the
// reason; Cancel and Replay, which the API exposes, tell ErrNotFound from
// a *job.TransitionError carrying the current status.
package store
