package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Batch offload, the batches' side (migrations/00031_batches.sql): one row
// per batch, moved a state forward only after what that state names is
// known, so the coordinator always knows which step to resume.

// BatchState is a batch row's step.
type BatchState string

const (
	BatchFormed    BatchState = "formed"    // members assigned, file name chosen
	BatchUploaded  BatchState = "uploaded"  // InputFileID known
	BatchSubmitted BatchState = "submitted" // ProviderBatchID known
	BatchFinished  BatchState = "finished"  // the provider's final status and files known
	BatchDone      BatchState = "done"      // every member's outcome stored
)

// OffloadLockID is the advisory lock that elects the one batch coordinator
// among consumer replicas (internal/offload).
const OffloadLockID = 0x6c6c6d71_00000031

// BatchRow is one batch.
type BatchRow struct {
	ID              int64
	Model           string
	State           BatchState
	FileName        string
	InputFileID     string
	ProviderBatchID string
	ProviderStatus  string
	OutputFileID    string
	ErrorFileID     string
	Jobs            int
	Bytes, Tokens   int64
	Window          time.Duration
	CreatedAt       time.Time
	SubmittedAt     *time.Time
}

const batchRowColumns = `id, model, state, file_name, coalesce(input_file_id, ''), coalesce(provider_batch_id, ''),
	coalesce(provider_status, ''), coalesce(output_file_id, ''), coalesce(error_file_id, ''), jobs, bytes, tokens,
	window_seconds, created_at, submitted_at`

func scanBatch(row pgx.Row) (BatchRow, error) {
	var b BatchRow
	var state string
	var window int
	err := row.Scan(&b.ID, &b.Model, &state, &b.FileName, &b.InputFileID, &b.ProviderBatchID, &b.ProviderStatus,
		&b.OutputFileID, &b.ErrorFileID, &b.Jobs, &b.Bytes, &b.Tokens, &window, &b.CreatedAt, &b.SubmittedAt)
	b.State, b.Window = BatchState(state), time.Duration(window)*time.Second
	return b, err
}

// WaitingBatched reports how many of model's batched jobs wait to be
// gathered (counting at most limit) and when the oldest was batched.
func (s *Store) WaitingBatched(ctx context.Context, model string, limit int) (n int, oldest time.Time, err error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var first *time.Time
	err = s.pool.QueryRow(ctx, `SELECT count(*), min(batched_at) FROM (SELECT batched_at FROM jobs
		WHERE status = 'batched' AND batch_id IS NULL AND model = $1 ORDER BY batched_at LIMIT $2) w`, model, limit).Scan(&n, &first)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("count waiting batched jobs of %s: %w", model, err)
	}
	if first != nil {
		oldest = *first
	}
	return n, oldest, nil
}

// BatchShape bounds a batch FormBatch gathers.
type BatchShape struct {
	MaxJobs  int
	MaxBytes int
	Window   time.Duration
	// LineBytes and Tokens size a member's line and its estimated tokens.
	LineBytes func(BatchMember) int
	Tokens    func(BatchMember) int64
}

// FormBatch gathers up to shape's bounds of model's waiting batched jobs,
// oldest first, into a new batch row (state formed, with a file name of
// its own) in one transaction. It returns false when none wait.
func (s *Store) FormBatch(ctx context.Context, model string, shape BatchShape) (BatchRow, bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var b BatchRow
	formed := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT tenant, id, request, deadline FROM jobs
			WHERE status = 'batched' AND batch_id IS NULL AND model = $1
			ORDER BY batched_at LIMIT $2 FOR UPDATE SKIP LOCKED`, model, shape.MaxJobs)
		if err != nil {
			return err
		}
		members, err := scanMembers(rows)
		if err != nil {
			return err
		}
		var size, tokens int64
		var tenants, ids []string
		for _, m := range members {
			line := int64(shape.LineBytes(m))
			if len(ids) > 0 && size+line > int64(shape.MaxBytes) {
				break
			}
			size += line
			tokens += shape.Tokens(m)
			tenants, ids = append(tenants, m.Key.Tenant), append(ids, m.Key.ID)
		}
		if len(ids) == 0 {
			return nil
		}
		b, err = scanBatch(tx.QueryRow(ctx, `INSERT INTO batches (model, file_name, jobs, bytes, tokens, window_seconds)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING `+batchRowColumns,
			model, fileName(), len(ids), size, tokens, int(shape.Window.Seconds())))
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE jobs SET batch_id = $1 FROM unnest($2::text[], $3::text[]) AS k(tenant, id)
			WHERE jobs.tenant = k.tenant AND jobs.id = k.id AND jobs.status = 'batched'`, b.ID, tenants, ids)
		formed = err == nil
		return err
	})
	if err != nil {
		return BatchRow{}, false, fmt.Errorf("form a batch of %s: %w", model, err)
	}
	return b, formed, nil
}

// fileName is a batch input file's name, unique across deployments that
// share a provider account: the key its upload is looked up by.
func fileName() string {
	var r [12]byte
	_, _ = rand.Read(r[:])
	return "llmq-batch-" + hex.EncodeToString(r[:]) + ".jsonl"
}

func scanMembers(rows pgx.Rows) ([]BatchMember, error) {
	var out []BatchMember
	var m BatchMember
	_, err := pgx.ForEachRow(rows, []any{&m.Key.Tenant, &m.Key.ID, &m.Request, &m.Deadline}, func() error {
		m.Request = append([]byte(nil), m.Request...)
		out = append(out, m)
		return nil
	})
	return out, err
}

// BatchMembers returns the jobs of batch that are still batched, in key
// order (the order of the batch's lines).
func (s *Store) BatchMembers(ctx context.Context, batch int64) ([]BatchMember, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rows, err := s.pool.Query(ctx, `SELECT tenant, id, request, deadline FROM jobs
		WHERE batch_id = $1 AND status = 'batched' ORDER BY tenant, id`, batch)
	if err != nil {
		return nil, fmt.Errorf("members of batch %d: %w", batch, err)
	}
	out, err := scanMembers(rows)
	if err != nil {
		return nil, fmt.Errorf("members of batch %d: %w", batch, err)
	}
	return out, nil
}

// OpenBatches returns every batch not done, oldest first.
func (s *Store) OpenBatches(ctx context.Context) ([]BatchRow, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rows, err := s.pool.Query(ctx, `SELECT `+batchRowColumns+` FROM batches WHERE state <> 'done' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("open batches: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BatchRow, error) { return scanBatch(r) })
	if err != nil {
		return nil, fmt.Errorf("open batches: %w", err)
	}
	return out, nil
}

// ErrBatchMoved is returned when a batch was not in the state a step
// expected (another coordinator moved it): re-read it.
var ErrBatchMoved = errors.New("batch is no longer in the expected state")

// AdvanceBatch moves batch from one state to the next and records what
// the step learnt (the non-empty fields of set: InputFileID,
// ProviderBatchID, ProviderStatus, OutputFileID, ErrorFileID).
func (s *Store) AdvanceBatch(ctx context.Context, id int64, from, to BatchState, set BatchRow) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	tag, err := s.pool.Exec(ctx, `UPDATE batches SET state = $3,
			input_file_id = coalesce(nullif($4, ''), input_file_id),
			provider_batch_id = coalesce(nullif($5, ''), provider_batch_id),
			provider_status = coalesce(nullif($6, ''), provider_status),
			output_file_id = coalesce(nullif($7, ''), output_file_id),
			error_file_id = coalesce(nullif($8, ''), error_file_id),
			submitted_at = CASE WHEN $3 = 'submitted' THEN now() ELSE submitted_at END,
			finished_at = CASE WHEN $3 = 'finished' THEN now() ELSE finished_at END,
			updated_at = now()
		WHERE id = $1 AND state = $2`, id, string(from), string(to),
		set.InputFileID, set.ProviderBatchID, set.ProviderStatus, set.OutputFileID, set.ErrorFileID)
	if err != nil {
		return fmt.Errorf("move batch %d from %s to %s: %w", id, from, to, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("move batch %d from %s to %s: %w", id, from, to, ErrBatchMoved)
	}
	return nil
}
