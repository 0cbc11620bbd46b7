package api_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/cpustat"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// benchPool opens a pool of its own size on a fresh migrated database.
func benchPool(b *testing.B, conns int) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testsvc.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(conns)
	cfg.MinConns = int32(conns)
	cfg.ConnConfig.RuntimeParams["application_name"] = benchApp
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// BenchmarkSubmit measures sustained POST /v1/jobs over a real HTTP server:
// each job is inserted in Postgres and confirmed by the broker before the
// 202. Run with:
//
//	go test -run x -bench BenchmarkSubmit -benchtime 20000x ./internal/api/
func BenchmarkSubmit(b *testing.B) {
	b.Run("rabbitmq", func(b *testing.B) {
		cfg := rabbitConfig(b)
		pub, insp := rabbitClients(b, cfg)
		benchSubmit(b, pub, insp)
	})
	b.Run("memory", func(b *testing.B) {
		mem := memory.New(memory.Config{})
		b.Cleanup(func() { _ = mem.Close() })
		benchSubmit(b, mem.Publisher(), mem.Inspector())
	})
}

func benchSubmit(b *testing.B, pub broker.Publisher, insp broker.Inspector) {
	pgPool := benchPool(b, 16)
	st := store.New(pgPool)
	srv, err := api.New(api.Config{
		Store: st, Publisher: pub, Inspector: insp, APIKeys: testKeys,
		Backpressure:   config.Backpressure{SoftLimit: 1 << 40, HardLimit: 1 << 41},
		CommitFlushers: envInt("LLMQ_BENCH_FLUSHERS", 0),
	})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	b.Cleanup(ts.Close)
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	var seq atomic.Int64
	prefix := fmt.Sprintf("bench-%d-", time.Now().UnixNano())
	b.SetParallelism(envInt("LLMQ_BENCH_PAR", 32)) // 32 × GOMAXPROCS concurrent clients
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpustat.Start(pgPool, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, benchApp)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := jobBody(prefix+fmt.Sprint(seq.Add(1)), nil)
			req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/jobs", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+keyAcme)
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
	cpu.Report(b, b.N, "api+client")
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

const benchApp = "llmq_api_bench"
