package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

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
func (s *Store) InsertTxBatch(ctx context.Context, jobs []job.Job, publish func(ctx context.Context, created []int) []error) ([]BatchInsert, error) {
	out := make([]BatchInsert, len(jobs))
	if len(jobs) == 0 {
		return out, nil
	}
	args := make([]jobArgs, len(jobs))
	for i, j := range jobs {
		args[i] = argsOf(j)
	}
	// One statement per distinct key, in key order: concurrent batches lock
	// rows in the same order and cannot deadlock.
	first := make(map[job.Key]int, len(jobs))
	var order []int
	for i, a := range args {
		k := job.Key{Tenant: a.tenant, ID: a.id}
		if _, dup := first[k]; !dup {
			first[k] = i
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(x, y int) int {
		if c := strings.Compare(args[x].tenant, args[y].tenant); c != 0 {
			return c
		}
		return strings.Compare(args[x].id, args[y].id)
	})

	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for i := range out {
			out[i] = BatchInsert{}
		}
		b := &pgx.Batch{}
		for _, i := range order {
			a := args[i]
			b.Queue(insertSQL, a.tenant, a.id, a.model, a.fallback, a.priority, a.request, a.metadata, a.maxAttempts, a.deadline)
		}
		br := tx.SendBatch(ctx, b)
		var created, existing []int
		for _, i := range order {
			rec, err := scanRecord(br.QueryRow())
			switch {
			case err == nil:
				out[i] = BatchInsert{Record: rec, Created: true}
				created = append(created, i)
			case errors.Is(err, pgx.ErrNoRows):
				existing = append(existing, i)
			default:
				br.Close()
				return fmt.Errorf("job %s: %w", args[i].id, err)
			}
		}
		if err := br.Close(); err != nil {
			return err
		}
		if len(existing) > 0 {
			b := &pgx.Batch{}
			for _, i := range existing {
				b.Queue(`SELECT `+jobColumns+` FROM jobs WHERE tenant = $1 AND id = $2`, args[i].tenant, args[i].id)
			}
			br := tx.SendBatch(ctx, b)
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
		if len(created) == 0 {
			return nil
		}
		errs := publish(ctx, created)
		if len(errs) != len(created) {
			return fmt.Errorf("publish returned %d results for %d jobs", len(errs), len(created))
		}
		b = &pgx.Batch{}
		for n, i := range created {
			if errs[n] != nil {
				out[i] = BatchInsert{Err: errs[n]}
				b.Queue(`DELETE FROM jobs WHERE tenant = $1 AND id = $2`, args[i].tenant, args[i].id)
			}
		}
		if b.Len() > 0 {
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return fmt.Errorf("remove unpublished jobs: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("insert batch of %d jobs: %w", len(jobs), err)
	}
	for i, a := range args {
		if f := first[job.Key{Tenant: a.tenant, ID: a.id}]; f != i {
			out[i] = BatchInsert{Record: out[f].Record, Err: out[f].Err}
		}
	}
	return out, nil
}
