package api_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
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
	cpu := startCPU(b, pgPool)
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
	cpu.report(b)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

const benchApp = "llmq_api_bench"

// cpuMeter measures CPU time per job, which unlike jobs/s does not depend on
// what else the machine runs: this process's (the HTTP clients, the API and
// the drivers, from rusage), its Postgres backends' (from /proc, by
// application_name) and the local RabbitMQ node's (beam.smp, from /proc;
// the node is shared, so other work on it counts too, and the memory
// sub-benchmark shows what that is).
type cpuMeter struct {
	process time.Duration
	pg      time.Duration
	broker  time.Duration
	pool    *pgxpool.Pool
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// postgresCPU sums the CPU time of the backends serving benchApp, or -1
// when Postgres runs elsewhere.
func postgresCPU(pool *pgxpool.Pool) time.Duration {
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, benchApp)
	if err != nil {
		return -1
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return -1
	}
	var total time.Duration
	for _, pid := range pids {
		d := procCPU(fmt.Sprint(pid))
		if d < 0 {
			return -1
		}
		total += d
	}
	return total
}

func startCPU(b *testing.B, pool *pgxpool.Pool) *cpuMeter {
	return &cpuMeter{process: processCPU(), pg: postgresCPU(pool), broker: brokerCPU(), pool: pool}
}

func (m *cpuMeter) report(b *testing.B) {
	proc := processCPU() - m.process
	b.ReportMetric(float64(proc.Microseconds())/float64(b.N), "api+client-cpu-µs/job")
	if m.pg >= 0 {
		if pg := postgresCPU(m.pool); pg >= 0 {
			b.ReportMetric(float64((pg-m.pg).Microseconds())/float64(b.N), "postgres-cpu-µs/job")
		}
	}
	if br := brokerCPU(); m.broker >= 0 && br >= 0 {
		b.ReportMetric(float64((br-m.broker).Microseconds())/float64(b.N), "rabbitmq-cpu-µs/job")
	}
}

// brokerCPU is the CPU time of the local RabbitMQ node, or -1.
func brokerCPU() time.Duration {
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range comms {
		if data, err := os.ReadFile(c); err == nil && strings.TrimSpace(string(data)) == "beam.smp" {
			return procCPU(filepath.Base(filepath.Dir(c)))
		}
	}
	return -1
}

// procCPU is the user+system CPU time of process pid, or -1.
func procCPU(pid string) time.Duration {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	var ticks int64
	for _, i := range []int{11, 12} { // utime, stime
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return -1
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}
