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
	open := func(b *testing.B) (*store.Store, *pgxpool.Pool) {
		cfg, err := pgxpool.ParseConfig(testsvc.PostgresURL(b))
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = 16
		cfg.ConnConfig.RuntimeParams["application_name"] = benchApp
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
	run := func(b *testing.B, write func(s *store.Store, jobs []job.Job) error) {
		s, pool := open(b)
		var n atomic.Int64
		b.SetParallelism(2) // 4 workers with GOMAXPROCS 2
		cpu := startCPU(b)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
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
				batch = append(batch, job.Job{ID: fmt.Sprintf("bench-%d", n.Add(1)), Tenant: "bench", Model: "qwen-plus",
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
