package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/internal/job"
)

// A parked job unparked with UnparkClaiming costs three writes: the parked
// insert, the claim and the completion. LockParked takes the claim's place
// with a row lock (docs/design.md#write-once): the rows stay parked, locked
// by an open transaction, while the worker runs them; SettleParked then writes
// each once, finished or claimed, and commits. A crash or a lost
// connection rolls the transaction back and the rows are parked as before,
// as a job taken write-once comes back from its intake message; the lock's
// record in parked_locks (migration 00040), written beside the
// transaction, then counts the attempt that was lost (reclaimLostLocksSQL).

// ParkedLock holds parked jobs of one group locked in an open
// transaction, until SettleParked or ReleaseParked ends it.
type ParkedLock struct {
	tx      pgx.Tx
	gate    *sync.Mutex // its group's (parkgate.go), held for the commit
	group   ParkedGroup
	marker  int64 // its parked_locks row
	owner   string
	lease   time.Duration
	records []Record
}

// lockParkedSQL selects the oldest parked jobs of a group ($1 tenant, $2
// model, $3 lane, $4 how many) that a claim would take, locking them. The
// keys come first, in a CTE shaped like unparkClaimingSQL's, so that the
// order is read off jobs_parked_idx: selected with every column at once the
// planner sorted the group's whole rows, spilling to disk under a flood.
// The scan tests parked_at alone, as the other parked probes do (migration
// 00034): a parked row is queued by the jobs_parked_queued CHECK, and a
// status test would imply jobs_backlog_idx's predicate, which stale
// statistics make the planner read, the whole lane's backlog per batch.
// The attempts test sits in a CASE for the same reason (byKey). $5, when
// not NULL, is where the scan starts (parkcursor.go).
var lockParkedSQL = `WITH c AS MATERIALIZED (
		SELECT tenant, id, created_at FROM jobs
		WHERE parked_at IS NOT NULL AND tenant = $1 AND model = $2 AND priority = $3
			AND created_at >= coalesce($5::timestamptz, '-infinity')
			AND CASE WHEN attempts < max_attempts THEN true ELSE false END
		ORDER BY created_at LIMIT $4 FOR UPDATE SKIP LOCKED)
	SELECT ` + qualifiedJobColumns + ` FROM c JOIN jobs ON jobs.tenant = c.tenant AND jobs.id = c.id
	ORDER BY c.created_at`

// LockParked locks up to limit parked jobs of g, oldest first, in a
// transaction that stays open: replicas unparking the same group skip
// them meanwhile. It returns nil when g has none left to lock. The
// records are as UnparkClaiming would return them, claimed by owner under
// lease from now, which is how SettleParked claims the rows it does not
// finish. The caller must end the lock with SettleParked or ReleaseParked, soon: the
// transaction holds a pool connection and keeps vacuum behind it.
func (s *Store) LockParked(ctx context.Context, g ParkedGroup, limit int, owner string, lease time.Duration) (*ParkedLock, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	if now := time.Now().UnixNano(); now >= s.reclaimAt.Load() {
		s.reclaimAt.Store(now + int64(reclaimEvery))
		if err := s.ReclaimLostLocks(ctx); err != nil {
			return nil, err
		}
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("lock parked jobs of tenant %s: %w", g.Tenant, err)
	}
	gate := s.gates.of(g)
	gate.Lock()
	recs, err := s.lockParked(ctx, tx, g, limit)
	gate.Unlock()
	if err != nil || len(recs) == 0 {
		rollback(tx)
		if err != nil {
			return nil, fmt.Errorf("lock parked jobs of tenant %s: %w", g.Tenant, err)
		}
		return nil, nil
	}
	keys := make([]job.Key, len(recs))
	for i, r := range recs {
		keys[i] = r.Key()
	}
	tenants, ids := keyArrays(keys)
	var marker int64
	if err := s.pool.QueryRow(ctx, `INSERT INTO parked_locks (owner, pid, tenants, ids) VALUES ($1, $2, $3, $4) RETURNING id`,
		owner, int32(tx.Conn().PgConn().PID()), tenants, ids).Scan(&marker); err != nil {
		rollback(tx)
		return nil, fmt.Errorf("record lock of parked jobs of tenant %s: %w", g.Tenant, err)
	}
	now := time.Now().UTC()
	end := now.Add(lease)
	for i := range recs {
		r := &recs[i]
		r.Status, r.Attempts, r.LeaseOwner, r.LeaseExpiresAt = job.StatusRunning, r.Attempts+1, owner, &end
		if r.StartedAt == nil {
			r.StartedAt = &now
		}
	}
	return &ParkedLock{tx: tx, gate: gate, group: g, marker: marker, owner: owner, lease: lease, records: recs}, nil
}

// stillParked holds for a locked job that no settle or reclaim has taken
// out of its parked state yet.
const stillParked = `jobs.status = 'queued' AND jobs.parked_at IS NOT NULL`

// reclaimLostLocksSQL ends the records of locks whose transaction is gone
// (no backend with their pid is in a transaction begun before the record
// was written): their jobs still parked, which ran unrecorded when their
// worker or its connection died, are marked as an attempt whose lease
// expired, for the reconciler to take over (store.TakeOrphaned) and the
// claim that follows to count. A job that kills its worker so reaches its
// max_attempts instead of running for ever.
//
// Rows locked meanwhile are skipped, not waited for, and the record is kept
// for them alone (its keys cut down to theirs): the lock may have been
// taken for lost by mistake (a role that cannot see the other replicas'
// transactions, a pooler that reports its own pid) and be alive. Its
// settle, deleting the record this statement holds, would deadlock with a
// wait; with the record kept, a batch that dies after such a look is still
// charged at the next one; and with its keys cut, a job charged here and
// parked again is not charged twice. A record none of whose jobs is held
// (they are no longer parked, or were charged here) is deleted.
var reclaimLostLocksSQL = `WITH lost AS (SELECT m.id, m.owner, m.tenants, m.ids FROM parked_locks m
		WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = m.pid AND a.xact_start <= m.locked_at)
		FOR UPDATE SKIP LOCKED),
	k AS (SELECT lost.id AS lock_id, lost.owner, t.tenant, t.id FROM lost, unnest(lost.tenants, lost.ids) AS t(tenant, id)),
	free AS (SELECT k.owner, jobs.tenant, jobs.id FROM k, jobs
		WHERE ` + byKey("k", stillParked) + `
		FOR UPDATE OF jobs SKIP LOCKED),
	held AS (SELECT k.lock_id, array_agg(k.tenant) AS tenants, array_agg(k.id) AS ids FROM k, jobs
		WHERE ` + byKey("k", stillParked) + `
		AND NOT EXISTS (SELECT 1 FROM free WHERE free.tenant = jobs.tenant AND free.id = jobs.id)
		GROUP BY k.lock_id),
	cut AS (UPDATE parked_locks m SET tenants = held.tenants, ids = held.ids FROM held WHERE m.id = held.lock_id),
	gone AS (DELETE FROM parked_locks WHERE id IN (SELECT id FROM lost) AND id NOT IN (SELECT lock_id FROM held))
	UPDATE jobs SET status = 'running', attempts = jobs.attempts + 1, lease_owner = free.owner, lease_expires_at = now(),
		started_at = coalesce(jobs.started_at, now()), next_attempt_at = NULL, parked_at = NULL, enqueued_at = NULL, updated_at = now()
	FROM free WHERE jobs.tenant = free.tenant AND jobs.id = free.id`

// reclaimEvery is how often LockParked looks for lost locks: a lost lock
// is rare (a crash), and the look reads pg_stat_activity, which costs
// about what locking a batch does.
const reclaimEvery = 10 * time.Second

// ReclaimLostLocks ends the records of locks whose transaction is gone
// (reclaimLostLocksSQL); LockParked calls it every reclaimEvery.
func (s *Store) ReclaimLostLocks(ctx context.Context) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	if _, err := s.pool.Exec(ctx, reclaimLostLocksSQL); err != nil {
		return fmt.Errorf("reclaim lost locks of parked jobs: %w", err)
	}
	return nil
}

// Records are the locked jobs, claimed as SettleParked would claim them.
func (l *ParkedLock) Records() []Record { return l.records }

// ParkedSuccess is one locked job that ran and succeeded.
type ParkedSuccess struct {
	Key    job.Key
	Result Result
}

// finishParkedSQL writes locked parked jobs as completeBatchSQL leaves a
// claimed job after its attempt succeeded, the attempt counted here, and
// deletes the lock's record ($7). The attempt logs and the responses are
// the last parameters, for insertBatchSQL's reason.
var finishParkedSQL = `WITH done AS (UPDATE jobs SET status = 'succeeded', attempts = jobs.attempts + 1,
		started_at = coalesce(jobs.started_at, u.started_at), parked_at = NULL, next_attempt_at = NULL,
		model_used = u.model_used, response = u.response::jsonb,
		prompt_tokens = u.prompt_tokens, completion_tokens = u.completion_tokens, completed_at = now(), finished_xid = pg_current_xact_id(),
		lease_owner = NULL, lease_expires_at = NULL, updated_at = now(), attempt_log = jobs.attempt_log || u.entry::jsonb
	FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $9::text[], $5::int[], $6::int[], $8::text[])
		AS u(tenant, id, started_at, model_used, response, prompt_tokens, completion_tokens, entry)
	WHERE ` + byKey("u", stillParked) + `
	RETURNING u.tenant, u.id, u.model_used, u.prompt_tokens, u.completion_tokens),
	` + successUsage + `,
	` + successEvents + `,
	gone AS (` + deleteLockRecordSQL + `$7)
	SELECT tenant, id FROM done`

// deleteLockRecordSQL, followed by a parameter, deletes a lock's record.
const deleteLockRecordSQL = `DELETE FROM parked_locks WHERE id = `

// claimParkedSQL claims locked parked jobs ($1 tenants, $2 ids) for $3
// under a lease of $4 µs, as unparkClaimingSQL does.
var claimParkedSQL = `UPDATE jobs SET ` + claimSet + `, enqueued_at = NULL
	FROM unnest($1::text[], $2::text[]) AS k(tenant, id)
	WHERE ` + byKey("k", stillParked) + `
	RETURNING jobs.tenant, jobs.id`

// SettleParked ends l: it writes the locked jobs that succeeded as
// finished and claims those of claim for the lock's owner, then commits;
// the locked jobs in neither stay parked. ok[i] reports succeeded[i]. On
// an error nothing is written and every locked job stays parked, except
// for *AnswersRefused: then every job of succeeded and claim is claimed.
func (s *Store) SettleParked(ctx context.Context, l *ParkedLock, succeeded []ParkedSuccess, claim []job.Key) ([]bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	ok := make([]bool, len(succeeded))
	err := l.settle(ctx, succeeded, claim, ok)
	if len(succeeded)+len(claim) < len(l.records) {
		s.cursors.drop(l.group) // the rest stay parked, before the cursor
	}
	var refused *AnswersRefused
	if errors.As(err, &refused) {
		return nil, err
	}
	if err != nil {
		s.cursors.drop(l.group)
		rollback(l.tx)
		return nil, fmt.Errorf("settle %d locked parked jobs: %w", len(succeeded)+len(claim), err)
	}
	return ok, nil
}

// settleTries bounds the tries of a settle's statements (settle).
const settleTries = 3

// settle writes the settle's statements and commits. A deadlock or a lock
// that could not be had fails a statement, not the transaction's work: the
// statements run again from a savepoint, so that the batch's answers,
// paid for, are not thrown away with a rollback.
func (l *ParkedLock) settle(ctx context.Context, succeeded []ParkedSuccess, claim []job.Key, ok []bool) error {
	for try := 1; ; try++ {
		if _, err := l.tx.Exec(ctx, `SAVEPOINT settle`); err != nil {
			return err
		}
		err := l.write(ctx, succeeded, claim, ok)
		if err == nil {
			return l.commit(ctx)
		}
		if Unstorable(err) && len(succeeded) > 0 {
			return l.settleClaimed(ctx, succeeded, claim, err)
		}
		if try == settleTries || !retryableInTx(err) || ctx.Err() != nil {
			return err
		}
		if _, rerr := l.tx.Exec(ctx, `ROLLBACK TO SAVEPOINT settle`); rerr != nil {
			return err
		}
		clear(ok)
		time.Sleep(time.Duration(try) * 20 * time.Millisecond)
	}
}

// AnswersRefused is SettleParked's error when Postgres refused the
// statement that writes the succeeded jobs for what an answer holds
// (Unstorable): the settle then claimed them with the others instead, and
// committed, so that their answers, paid for, can be stored one by one.
type AnswersRefused struct{ Err error }

func (e *AnswersRefused) Error() string {
	return "settle locked parked jobs: the answers were refused, the jobs claimed: " + e.Err.Error()
}

func (e *AnswersRefused) Unwrap() error { return e.Err }

// settleClaimed settles l from the savepoint with succeeded claimed, not
// written finished, after refused (Unstorable) failed the finish.
func (l *ParkedLock) settleClaimed(ctx context.Context, succeeded []ParkedSuccess, claim []job.Key, refused error) error {
	if _, err := l.tx.Exec(ctx, `ROLLBACK TO SAVEPOINT settle`); err != nil {
		return refused
	}
	all := slices.Clone(claim)
	for _, it := range succeeded {
		all = append(all, it.Key)
	}
	if err := l.write(ctx, nil, all, nil); err != nil {
		return err
	}
	if err := l.commit(ctx); err != nil {
		return err
	}
	return &AnswersRefused{Err: refused}
}

// retryableInTx reports an error that ends a statement, not its
// connection, and may not recur: a deadlock, a lock that could not be had,
// a serialization failure.
func retryableInTx(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "40P01", "55P03", "40001":
		return true
	}
	return false
}

// write runs the claim first and the finish last, just before the commit:
// the finish adds to usage_hours, whose row (one of 16 shards) a
// completion on another connection may be waiting for.
func (l *ParkedLock) write(ctx context.Context, succeeded []ParkedSuccess, claim []job.Key, ok []bool) error {
	if len(claim) > 0 {
		tenants, ids := keyArrays(claim)
		if _, err := l.tx.Exec(ctx, claimParkedSQL, tenants, ids, l.owner, leaseMicros(l.lease)); err != nil {
			return err
		}
	}
	if len(succeeded) == 0 {
		_, err := l.tx.Exec(ctx, deleteLockRecordSQL+`$1`, l.marker)
		return err
	}
	started := make(map[job.Key]time.Time, len(l.records))
	attempts := make(map[job.Key]int, len(l.records))
	for _, r := range l.records {
		started[r.Key()], attempts[r.Key()] = *r.StartedAt, r.Attempts
	}
	n := len(succeeded)
	tenants, ids, models, responses, entries := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	starts, prompt, completion := make([]time.Time, n), make([]int32, n), make([]int32, n)
	index := make(map[job.Key]int, n)
	for i, it := range succeeded {
		r := it.Result
		tenants[i], ids[i], starts[i] = it.Key.Tenant, it.Key.ID, started[it.Key]
		models[i], responses[i] = r.ModelUsed, responseText(r)
		prompt[i], completion[i] = int32(r.PromptTokens), int32(r.CompletionTokens)
		entries[i] = logEntry(r.Trace.successOf(Attempt{Key: it.Key, Owner: l.owner, N: attempts[it.Key]}, r))
		index[it.Key] = i
	}
	rows, err := l.tx.Query(ctx, finishParkedSQL, tenants, ids, starts, models, prompt, completion, l.marker, entries, responses)
	if err != nil {
		return err
	}
	var k job.Key
	if _, err := pgx.ForEachRow(rows, []any{&k.Tenant, &k.ID}, func() error {
		if i, found := index[k]; found {
			ok[i] = true
		}
		return nil
	}); err != nil {
		return err
	}
	return nil
}

// commit commits the settle through its group's gate (parkgate.go).
func (l *ParkedLock) commit(ctx context.Context) error {
	l.gate.Lock()
	defer l.gate.Unlock()
	return l.tx.Commit(ctx)
}

// ReleaseParked ends l writing nothing: every locked job stays parked.
// The record goes before the rows are let go: the other way round, a look
// for lost locks in between would read the record as lost and charge jobs
// that never ran an attempt.
func (s *Store) ReleaseParked(ctx context.Context, l *ParkedLock) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	_, err := s.pool.Exec(ctx, deleteLockRecordSQL+`$1`, l.marker)
	rollback(l.tx)
	s.cursors.drop(l.group)
	if err != nil {
		return fmt.Errorf("release lock of parked jobs: %w", err)
	}
	return nil
}

// rollback ends tx. Its error is not worth reporting: a rollback that
// fails has lost its connection, and the transaction ended with it.
func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx)
}
