package store_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/pgcodec"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// BenchmarkDirectJob measures the store's work for a job the direct
// intake runs, in batches of 100 over 4 workers: "claimed" inserts it
// claimed and then completes it (two writes of the row), "once" writes it
// once, finished, with its result (write-once, InsertFinished). Run with
//
//	LLMQ_TEST_POSTGRES_URL=… go test -run '^$' -bench DirectJob -benchtime 20000x ./internal/store/
func BenchmarkDirectJob(b *testing.B) {
	request, res := benchPayload()
	ctx := context.Background()
	run := func(b *testing.B, write func(s *store.Store, jobs []job.Job) error) {
		runJobBatches(b, request, false, write)
	}
	b.Run("claimed", func(b *testing.B) {
		run(b, func(s *store.Store, jobs []job.Job) error {
			claim := make([]bool, len(jobs))
			for i := range claim {
				claim[i] = true
			}
			got, err := s.InsertClaiming(ctx, jobs, store.Claiming{Claim: claim, Owner: "bench", Lease: time.Minute})
			if err != nil {
				return err
			}
			items := make([]store.Completion, len(jobs))
			for i, g := range got {
				if !g.Claimed {
					return fmt.Errorf("job %s not claimed", jobs[i].ID)
				}
				items[i] = store.Completion{Attempt: store.Attempt{Key: jobs[i].Key(), Owner: "bench", N: 1}, Result: res}
			}
			ok, err := s.CompleteBatch(ctx, items)
			return checkAll("complete", ok, err)
		})
	})
	b.Run("once", func(b *testing.B) {
		run(b, func(s *store.Store, jobs []job.Job) error {
			items := make([]store.Finished, len(jobs))
			now := time.Now()
			for i, j := range jobs {
				items[i] = store.Finished{Job: j, Owner: "bench", ReadAt: now, Result: res}
			}
			ok, err := s.InsertFinished(ctx, items)
			return checkAll("insert finished", ok, err)
		})
	})
}

// runJobBatches has 4 workers write b.N jobs of request through write in
// batches of 100 and reports jobs/s and the CPU per job of this process
// and of Postgres; with tenantPerWorker each worker's jobs are a tenant
// of their own, otherwise all are tenant "bench".
func runJobBatches(b *testing.B, request []byte, tenantPerWorker bool, write func(s *store.Store, jobs []job.Job) error) {
	s, pool := benchStore(b)
	var n, workers atomic.Int64
	b.SetParallelism(2) // 4 workers with GOMAXPROCS 2
	cpu := startCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		tenant := "bench"
		if tenantPerWorker {
			tenant = fmt.Sprintf("bench-%d", workers.Add(1))
		}
		batch := make([]job.Job, 0, 100)
		flush := func() bool {
			if len(batch) == 0 {
				return true
			}
			if err := write(s, batch); err != nil {
				b.Error(err)
				return false
			}
			batch = batch[:0]
			return true
		}
		for pb.Next() {
			batch = append(batch, job.Job{ID: fmt.Sprintf("bench-%d", n.Add(1)), Tenant: tenant, Model: "qwen-plus",
				Priority: job.PriorityNormal, Request: request, MaxAttempts: 5})
			if len(batch) == cap(batch) && !flush() {
				return
			}
		}
		flush()
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
	cpu.report(b, pool)
}

// benchStore is a store on a pool of 16 connections whose backends
// cpuMeter finds by their application_name; LLMQ_BENCH_SETUP_SQL, when
// set, runs first.
func benchStore(b *testing.B) (*store.Store, *pgxpool.Pool) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testsvc.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 16
	cfg.ConnConfig.RuntimeParams["application_name"] = benchApp
	pgcodec.Configure(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if q := os.Getenv("LLMQ_BENCH_SETUP_SQL"); q != "" {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatalf("LLMQ_BENCH_SETUP_SQL: %v", err)
		}
	}
	return store.New(pool), pool
}

func checkAll(what string, ok []bool, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	for i, o := range ok {
		if !o {
			return fmt.Errorf("%s: item %d refused", what, i)
		}
	}
	return nil
}

// BenchmarkParkedJob measures the store's work for a parked job the
// unparker runs, in batches of 100 over 4 workers, each its own tenant:
// the job is inserted and parked, then "claimed" unparks it claimed and
// completes it (store.UnparkClaiming, CompleteBatch), "locked" locks it
// and writes it once, finished (LockParked, SettleParked). Run with
//
//	LLMQ_TEST_POSTGRES_URL=… go test -run '^$' -bench ParkedJob -benchtime 20000x ./internal/store/
func BenchmarkParkedJob(b *testing.B) {
	request, res := benchPayload()
	ctx := context.Background()
	run := func(b *testing.B, runParked func(s *store.Store, g store.ParkedGroup, n int) error) {
		runJobBatches(b, request, true, func(s *store.Store, jobs []job.Job) error {
			keys := make([]job.Key, len(jobs))
			for i, j := range jobs {
				keys[i] = j.Key()
			}
			if _, err := s.InsertBatch(ctx, jobs); err != nil {
				return err
			}
			if _, err := s.Park(ctx, keys); err != nil {
				return err
			}
			return runParked(s, store.ParkedGroup{Tenant: jobs[0].Tenant, Model: "qwen-plus", Lane: job.PriorityNormal}, len(jobs))
		})
	}
	b.Run("claimed", func(b *testing.B) {
		run(b, func(s *store.Store, g store.ParkedGroup, n int) error {
			recs, err := s.UnparkClaiming(ctx, g, n, "bench", time.Minute)
			if err != nil {
				return err
			}
			items := make([]store.Completion, len(recs))
			for i, r := range recs {
				items[i] = store.Completion{Attempt: store.Attempt{Key: r.Key(), Owner: "bench", N: r.Attempts}, Result: res}
			}
			ok, err := s.CompleteBatch(ctx, items)
			return checkAll("complete", ok, err)
		})
	})
	b.Run("locked", func(b *testing.B) {
		run(b, func(s *store.Store, g store.ParkedGroup, n int) error {
			l, err := s.LockParked(ctx, g, n, "bench", time.Minute)
			if err != nil || l == nil {
				return fmt.Errorf("lock: %v", err)
			}
			items := make([]store.ParkedSuccess, len(l.Records()))
			for i, r := range l.Records() {
				items[i] = store.ParkedSuccess{Key: r.Key(), Result: res}
			}
			ok, err := s.SettleParked(ctx, l, items, nil)
			return checkAll("settle", ok, err)
		})
	})
}
