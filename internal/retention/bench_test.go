package retention_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/cpustat"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/retention"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// benchRows is how many finished rows the benchmarks generate
// (LLMQ_RETENTION_ROWS, default 100000).
func benchRows(b *testing.B) int {
	if s := os.Getenv("LLMQ_RETENTION_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("LLMQ_RETENTION_ROWS: %v", err)
		}
		return n
	}
	return 100_000
}

// fill generates n succeeded jobs of tenant "old" with small bodies, the
// last finished age ago and each earlier one a millisecond before, by SQL.
// Triggers are off for the fill (no result_events outbox); finished_xid is
// set as the trigger would, so the feed index holds them as in production.
func fill(b *testing.B, pool *pgxpool.Pool, n int, age time.Duration) {
	b.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET session_replication_role = replica`); err != nil {
		b.Fatal(err)
	}
	defer conn.Exec(ctx, `SET session_replication_role = DEFAULT`) //nolint:errcheck
	const chunk = 500_000
	for from := 0; from < n; from += chunk {
		_, err := conn.Exec(ctx, `INSERT INTO jobs (tenant, id, model, request, status, attempts, model_used, response,
				prompt_tokens, completion_tokens, created_at, started_at, completed_at, finished_xid)
			SELECT 'old', 'old-' || g, 'qwen-plus', '{"messages": [{"role": "user", "content": "hi"}]}', 'succeeded', 1,
				'qwen-plus', '{"choices": [{"message": {"content": "hello"}}]}', 10, 5,
				t - interval '2 seconds', t - interval '1 second', t, pg_current_xact_id()
			FROM generate_series($1::int, $2::int) AS g,
				LATERAL (SELECT now() - $3 * interval '1 second' - (($4::int - g) * interval '1 millisecond') AS t) AS x`,
			from+1, min(from+chunk, n), age.Seconds(), n)
		if err != nil {
			b.Fatal(err)
		}
	}
	// The fill's dirty pages and WAL are flushed before the measurement,
	// not during it.
	for _, sql := range []string{`VACUUM ANALYZE jobs`, `CHECKPOINT`} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
}

// benchPool is a pool of 16 connections on a fresh database, as the
// store's own hot-path benchmark uses.
func benchPool(b *testing.B) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testsvc.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

func benchPolicy(pause time.Duration) retention.Config {
	return retention.Config{Jobs: retention.Policy{job.StatusSucceeded: 7 * day}, Batch: 1000, Pause: pause}
}

// BenchmarkSweep measures how fast the sweeper deletes expired jobs (with
// their tombstones) with no pause between batches: the rate it can reach,
// which the pause then throttles. Run with
//
//	LLMQ_RETENTION_ROWS=1000000 go test -run '^$' -bench 'Sweep$' -benchtime 1x -timeout 1h ./internal/retention/
func BenchmarkSweep(b *testing.B) {
	n := benchRows(b)
	ctx := context.Background()
	var deleted int
	var elapsed time.Duration
	for range b.N {
		b.StopTimer()
		pool := testsvc.Postgres(b)
		fill(b, pool, n, 10*day)
		s, err := retention.New(benchPolicy(0), store.New(pool), nil, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		got, err := s.Sweep(ctx)
		elapsed += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if got["succeeded"] != n {
			b.Fatalf("swept %d of %d", got["succeeded"], n)
		}
		deleted += got["succeeded"]
	}
	b.ReportMetric(float64(deleted)/elapsed.Seconds(), "rows/s")
}

// BenchmarkClaimComplete measures the worker's store hot path (claim by
// key, store the result; 8 workers, 16 connections) beside an empty table,
// beside benchRows finished jobs inside their retention, and beside as
// many expired ones while the sweeper (default batch and pause) deletes
// them. Run with
//
//	LLMQ_RETENTION_ROWS=1000000 go test -run '^$' -bench 'ClaimComplete' -benchtime 20000x -timeout 1h ./internal/retention/
func BenchmarkClaimComplete(b *testing.B) {
	n := benchRows(b)
	for _, tc := range []struct {
		name  string
		rows  int
		age   time.Duration
		sweep bool
	}{
		{"empty", 0, 0, false},
		{"retained", n, day, false},
		{"sweeping", n, 10 * day, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.StopTimer()
			pool := benchPool(b)
			fill(b, pool, tc.rows, tc.age)
			request := json.RawMessage(fmt.Sprintf(`{"messages": [{"role": "user", "content": %q}]}`, strings.Repeat("lorem ", 100)))
			jobs := make([]job.Job, 0, 1000)
			st := store.New(pool)
			ctx := context.Background()
			for i := 0; i < b.N; i++ {
				jobs = append(jobs, job.Job{Tenant: "bench", ID: fmt.Sprintf("j-%d", i), Model: "qwen-plus", Priority: job.PriorityNormal, Request: request})
				if len(jobs) == cap(jobs) || i == b.N-1 {
					if _, err := st.InsertBatch(ctx, jobs); err != nil {
						b.Fatal(err)
					}
					jobs = jobs[:0]
				}
			}
			var swept atomic.Int64
			sweepCtx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			if tc.sweep {
				s, err := retention.New(benchPolicy(50*time.Millisecond), st, nil, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					for sweepCtx.Err() == nil {
						got, _ := s.Sweep(sweepCtx)
						swept.Add(int64(got["succeeded"]))
					}
				})
			}
			res := store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{"choices": []}`), PromptTokens: 10, CompletionTokens: 5}
			var next atomic.Int64
			b.SetParallelism(4)
			cpu := cpustat.Start(pool, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
			b.StartTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := job.Key{Tenant: "bench", ID: fmt.Sprintf("j-%d", next.Add(1)-1)}
					c, err := st.Claim(ctx, key, "bench", time.Minute)
					if err != nil || c.Outcome != store.Claimed {
						b.Errorf("claim %s: %v %v", key.ID, c.Outcome, err)
						return
					}
					if ok, err := st.Complete(ctx, c.AttemptOf("bench"), res); err != nil || !ok {
						b.Errorf("complete: %v %v", ok, err)
						return
					}
				}
			})
			b.StopTimer()
			// With the sweeper running, its backend's CPU counts too.
			cpu.Report(b, b.N, "bench")
			stop()
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
			if tc.sweep {
				b.ReportMetric(float64(swept.Load())/b.Elapsed().Seconds(), "swept/s")
			}
		})
	}
}
