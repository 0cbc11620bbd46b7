package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// This file serves the producer API's group commit. It is the one write in
// the api_*.go files: InsertTxBatch is InsertTx for many jobs in one
// transaction, so that N concurrent submissions cost one commit (one WAL
// flush) instead of N.

// BatchInsert is the outcome of one job of InsertTxBatch.
type BatchInsert struct {
	Record Record
	// Created is true when this call stored the job; false for a job that
	// existed already (Record is then the existing row) or when Err is set.
	Created bool
	// Err is the publish error of a created job; the job was not stored.
	Err error
}

// insertBatchSQL is insertSQL over arrays (the encoding of claimBatchSQL),
// rows inserted in key order so that concurrent batches lock keys in the
// same order and cannot deadlock. It returns only what the caller does not
// already have: a created job's row is the job as given plus the table's
// defaults, and printing its request jsonb back would cost the server
// about as much as inserting it.
const insertBatchSQL = `INSERT INTO jobs (tenant, id, model, fallback_models, priority, request, metadata, max_attempts, deadline)
	SELECT u.tenant, u.id, u.model, ARRAY(SELECT jsonb_array_elements_text(u.fallback)), u.priority,
		u.request::jsonb, u.metadata::jsonb, u.max_attempts, u.deadline
	FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $6::text[], $7::text[],
		$8::int[], $9::timestamptz[]) AS u(tenant, id, model, fallback, priority, request, metadata, max_attempts, deadline)
	ORDER BY u.tenant, u.id
	ON CONFLICT (tenant, id) DO NOTHING
	RETURNING tenant, id, created_at, updated_at`

// InsertTxBatch inserts jobs (insert-if-absent, as Insert) in one
// transaction, calls publish once with the indexes of the jobs it created,
// deletes within the same transaction the created jobs whose publish failed
// (publish returns one error per index given, nil for success), and
// commits. So every job reported Created is stored and was published, and
// a job whose publish failed leaves nothing. A key repeated within jobs is
// created once; its repeats report Created=false with the same Record (or
// the same Err). An error return (the transaction failed) applies to every
// job: none is stored, though jobs already published stay on the queue,
// where the consumer's InsertAndClaim creates them (as with InsertTx).
//
// The Record of a created job is the job as given (request byte for byte,
// not as jsonb prints it) in status queued with the stored timestamps; the
// Record of an existing job is its row. Round trips: BEGIN and the insert
// together, a read of the existing jobs (when there are any), then the
// removal of unpublished jobs (when there are any) with COMMIT.
func (s *Store) InsertTxBatch(ctx context.Context, jobs []job.Job, publish func(ctx context.Context, created []int) []error) ([]BatchInsert, error) {
	out := make([]BatchInsert, len(jobs))
	if len(jobs) == 0 {
		return out, nil
	}
	n := len(jobs)
	c, err := columnsOf(jobs)
	if err != nil {
		return nil, fmt.Errorf("insert batch: %w", err)
	}
	args, first := c.args, c.first

	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("insert batch of %d jobs: %w", n, err)
	}
	// A connection left inside a transaction (an error below) is not
	// reused: pgxpool destroys a released connection that is not idle.
	defer conn.Release()
	err = func() error {
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(insertBatchSQL, c.tenants, c.ids, c.models, c.fallbacks, c.priorities, c.requests, c.metadata, c.maxAttempts, c.deadlines)
		br := conn.SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			br.Close()
			return fmt.Errorf("begin: %w", err)
		}
		rows, err := br.Query()
		if err != nil {
			br.Close()
			return err
		}
		created := make([]bool, n)
		var (
			key                  job.Key
			createdAt, updatedAt time.Time
		)
		_, err = pgx.ForEachRow(rows, []any{&key.Tenant, &key.ID, &createdAt, &updatedAt}, func() error {
			i, ok := first[key]
			if !ok {
				return fmt.Errorf("insert returned job %s that was not given", key.ID)
			}
			out[i] = BatchInsert{Record: insertedRecord(jobs[i], args[i], createdAt, updatedAt), Created: true}
			created[i] = true
			return nil
		})
		if err != nil {
			br.Close()
			return err
		}
		if err := br.Close(); err != nil {
			return err
		}
		var createdIdx, existing []int
		for _, i := range first {
			if created[i] {
				createdIdx = append(createdIdx, i)
			} else {
				existing = append(existing, i)
			}
		}
		slices.Sort(createdIdx)
		slices.Sort(existing)
		if len(existing) > 0 {
			b := &pgx.Batch{}
			for _, i := range existing {
				b.Queue(`SELECT `+jobColumns+` FROM jobs WHERE tenant = $1 AND id = $2`, args[i].tenant, args[i].id)
			}
			br := conn.SendBatch(ctx, b)
			for _, i := range existing {
				rec, err := scanRecord(br.QueryRow())
				if err != nil {
					br.Close()
					return fmt.Errorf("job %s: read existing: %w", args[i].id, err)
				}
				out[i] = BatchInsert{Record: rec}
			}
			if err := br.Close(); err != nil {
				return err
			}
		}
		b = &pgx.Batch{}
		if len(createdIdx) > 0 {
			errs := publish(ctx, createdIdx)
			if len(errs) != len(createdIdx) {
				return fmt.Errorf("publish returned %d results for %d jobs", len(errs), len(createdIdx))
			}
			for k, i := range createdIdx {
				if errs[k] != nil {
					out[i] = BatchInsert{Err: errs[k]}
					b.Queue(`DELETE FROM jobs WHERE tenant = $1 AND id = $2`, args[i].tenant, args[i].id)
				}
			}
		}
		b.Queue(`COMMIT`)
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("remove unpublished jobs and commit: %w", err)
		}
		return nil
	}()
	if err != nil {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			// Best effort; on failure the pool discards the connection.
			_, _ = conn.Exec(context.WithoutCancel(ctx), `ROLLBACK`)
		}
		return nil, fmt.Errorf("insert batch of %d jobs: %w", n, err)
	}
	for i, a := range args {
		if f := first[job.Key{Tenant: a.tenant, ID: a.id}]; f != i {
			out[i] = BatchInsert{Record: out[f].Record, Err: out[f].Err}
		}
	}
	return out, nil
}

// insertedRecord is the Record of a job the insert created: the job with
// the contract's defaults (argsOf) and the table's, and the row's times.
func insertedRecord(j job.Job, a jobArgs, createdAt, updatedAt time.Time) Record {
	j.Normalize()
	r := Record{Job: j, Status: job.StatusQueued, Errors: []AttemptError{},
		CreatedAt: createdAt.UTC(), UpdatedAt: updatedAt.UTC()}
	r.Tenant, r.ID, r.Model, r.Priority, r.MaxAttempts = a.tenant, a.id, a.model, job.Priority(a.priority), a.maxAttempts
	r.FallbackModels = nil
	if len(a.fallback) > 0 {
		r.FallbackModels = a.fallback
	}
	r.Request = json.RawMessage(a.request)
	r.Metadata = nil
	if a.metadata != nil {
		r.Metadata = json.RawMessage(*a.metadata)
	}
	if a.deadline != nil {
		d := a.deadline.UTC()
		r.Deadline = &d
	}
	return r
}
