package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/pgcodec"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// BenchmarkClaimComplete measures the consumer's hot path in the store for
// a job whose message arrives from the queue: the row is already stored (by
// the API or the ingester, outside the timer), so the worker claims it by
// key, then stores the result. 8 workers share a pool of 16 connections.
// Run with
//
//	LLMQ_TEST_POSTGRES_URL=… go test -run '^$' -bench ClaimComplete -benchtime 20000x ./internal/store/
//
// LLMQ_BENCH_SETUP_SQL runs once on the filled database before the timer
// starts, to measure the hot path without an index or with another one.
func BenchmarkClaimComplete(b *testing.B) {
	request, res := benchPayload()
	const tenant = "bench"
	id := func(i int64) string { return fmt.Sprintf("bench-%d", i) }

	// setup opens a fresh database, stores b.N queued jobs there, and
	// returns the store the workers use and next, which hands out the keys
	// of the stored jobs, each once.
	setup := func(b *testing.B) (*store.Store, *pgxpool.Pool, func() job.Key) {
		b.StopTimer()
		defer b.StartTimer()
		u := testsvc.PostgresURL(b)
		preInsert(b, u, b.N, func(i int) job.Job {
			return job.Job{ID: id(int64(i + 1)), Tenant: tenant, Model: "qwen-plus",
				Priority: job.PriorityNormal, Request: request, MaxAttempts: 5}
		})
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = 16
		cfg.ConnConfig.RuntimeParams["application_name"] = benchApp
		pgcodec.Configure(cfg)
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		if q := os.Getenv("LLMQ_BENCH_SETUP_SQL"); q != "" {
			// An index to compare with and without (e.g. "DROP INDEX x").
			if _, err := pool.Exec(context.Background(), q); err != nil {
				b.Fatalf("LLMQ_BENCH_SETUP_SQL: %v", err)
			}
		}
		var n atomic.Int64
		next := func() job.Key { return job.Key{Tenant: tenant, ID: id(n.Add(1))} }
		return store.New(pool), pool, next
	}
	const workers = 8
	ctx := context.Background()

	b.Run("single", func(b *testing.B) {
		s, pool, next := setup(b)
		b.SetParallelism((workers + 1) / 2) // GOMAXPROCS is 2 here
		cpu := startCPU(b)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c, err := s.Claim(ctx, next(), "bench", time.Minute)
				if err != nil || c.Outcome != store.Claimed {
					b.Errorf("claim: %v %v", c.Outcome, err)
					return
				}
				ok, err := s.Complete(ctx, c.AttemptOf("bench"), res)
				if err != nil || !ok {
					b.Errorf("complete: %v %v", ok, err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
		cpu.report(b, pool)
	})

	b.Run("batch100", func(b *testing.B) {
		s, pool, next := setup(b)
		b.SetParallelism((workers + 1) / 2)
		cpu := startCPU(b)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			batch := make([]job.Key, 0, 100)
			flush := func() bool {
				if len(batch) == 0 {
					return true
				}
				claims, err := s.ClaimBatch(ctx, batch, "bench", time.Minute)
				if err != nil {
					b.Errorf("claim batch: %v", err)
					return false
				}
				items := make([]store.Completion, len(claims))
				for i, c := range claims {
					if c.Outcome != store.Claimed {
						b.Errorf("claim batch: %s: %v", batch[i].ID, c.Outcome)
						return false
					}
					items[i] = store.Completion{Attempt: c.AttemptOf("bench"), Result: res}
				}
				oks, err := s.CompleteBatch(ctx, items)
				if err != nil {
					b.Errorf("complete batch: %v", err)
					return false
				}
				for i, ok := range oks {
					if !ok {
						b.Errorf("complete batch: %s refused", items[i].Key.ID)
						return false
					}
				}
				batch = batch[:0]
				return true
			}
			for pb.Next() {
				batch = append(batch, next())
				if len(batch) == cap(batch) && !flush() {
					return
				}
			}
			flush()
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
		cpu.report(b, pool)
	})
}

// benchPayload is a ≈1 KB job request and a result for it.
func benchPayload() (json.RawMessage, store.Result) {
	request := json.RawMessage(fmt.Sprintf(`{"messages": [{"role": "user", "content": %q}], "max_tokens": 256}`,
		strings.Repeat("lorem ipsum ", 80)))
	response := json.RawMessage(fmt.Sprintf(`{"choices": [{"message": {"role": "assistant", "content": %q}}]}`,
		strings.Repeat("dolor sit amet ", 30)))
	return request, store.Result{ModelUsed: "qwen-plus", Response: response, PromptTokens: 250, CompletionTokens: 120}
}

// preInsert stores n queued jobs (jobAt(0..n-1)) in the database at u with
// InsertBatch in chunks, through a pool of its own that is closed before
// the measurement, so that neither its time nor its server CPU (the meter
// finds the measured backends by application_name) is counted.
func preInsert(b *testing.B, u string, n int, jobAt func(i int) job.Job) {
	b.Helper()
	const chunk = 1000
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	s := store.New(pool)
	jobs := make([]job.Job, 0, chunk)
	for from := 0; from < n; from += chunk {
		jobs = jobs[:0]
		for i := from; i < min(from+chunk, n); i++ {
			jobs = append(jobs, jobAt(i))
		}
		res, err := s.InsertBatch(ctx, jobs)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range res {
			if !r.Created {
				b.Fatalf("pre-insert: job %s already existed", r.Record.ID)
			}
		}
	}
}

const benchApp = "llmq_store_bench"

// cpuMeter measures CPU time per job, which unlike jobs/s does not depend on
// what else the machine runs: the benchmark process's own (rusage) and,
// when Postgres runs on this host, its backends' (from /proc, found by
// application_name). 2 cores divided by the sum of both gives the
// throughput an otherwise idle 2-core machine could reach.
type cpuMeter struct{ client time.Duration }

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU(b *testing.B) *cpuMeter { return &cpuMeter{client: processCPU()} }

func (m *cpuMeter) report(b *testing.B, pool *pgxpool.Pool) {
	client := processCPU() - m.client
	b.ReportMetric(float64(client.Microseconds())/float64(b.N), "client-cpu-µs/job")
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, benchApp)
	if err != nil {
		return
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return
	}
	var ticks int64
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return // Postgres is on another host
		}
		// Fields after the parenthesised command: state is field 3, utime 14, stime 15.
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
		for _, i := range []int{11, 12} {
			v, err := strconv.ParseInt(f[i], 10, 64)
			if err != nil {
				return
			}
			ticks += v
		}
	}
	server := time.Duration(ticks) * time.Second / 100 // USER_HZ
	b.ReportMetric(float64(server.Microseconds())/float64(b.N), "server-cpu-µs/job")
}
