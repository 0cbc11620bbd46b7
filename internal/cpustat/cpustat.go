// Package cpustat reads CPU time of this process, of Postgres backends and
// of the local RabbitMQ node, for benchmarks that report CPU per operation:
// unlike operations per second, CPU per operation moves little with what
// else the machine runs. Linux only (rusage and /proc); a figure that
// cannot be read is -1 and is not reported.
package cpustat

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Process is this process's user+system CPU time.
func Process() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Proc is the user+system CPU time of process pid, or -1.
func Proc(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	p, ok := parseStat(data)
	if !ok {
		return -1
	}
	return time.Duration(p.ticks) * time.Second / userHZ
}

// Postgres sums the CPU time of the backends whose pids pidQuery (a query
// on pg_stat_activity) returns, or -1 when Postgres runs elsewhere.
func Postgres(pool *pgxpool.Pool, pidQuery string, args ...any) time.Duration {
	rows, err := pool.Query(context.Background(), pidQuery, args...)
	if err != nil {
		return -1
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return -1
	}
	var total time.Duration
	for _, pid := range pids {
		d := Proc(int(pid))
		if d < 0 {
			return -1
		}
		total += d
	}
	return total
}

// RabbitMQ is the CPU time of the local RabbitMQ node (beam.smp), or -1.
// The node is shared: other work on it counts too.
func RabbitMQ() time.Duration {
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range comms {
		if data, err := os.ReadFile(c); err == nil && strings.TrimSpace(string(data)) == "beam.smp" {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(c)))
			return Proc(pid)
		}
	}
	return -1
}

// Meter measures CPU per job over a benchmark: this process's, its
// Postgres backends' and the RabbitMQ node's.
type Meter struct {
	process, pg, broker time.Duration
	pool                *pgxpool.Pool
	pidQuery            string
	args                []any
}

// Start reads the starting figures; pidQuery and args select the backends
// (see Postgres).
func Start(pool *pgxpool.Pool, pidQuery string, args ...any) *Meter {
	return &Meter{process: Process(), pg: Postgres(pool, pidQuery, args...), broker: RabbitMQ(),
		pool: pool, pidQuery: pidQuery, args: args}
}

// Report reports CPU µs per job since Start: this process's as
// "<process>-cpu-µs/job", then "postgres-cpu-µs/job" and
// "rabbitmq-cpu-µs/job" where they can be read.
func (m *Meter) Report(b *testing.B, jobs int, process string) {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(jobs) }
	b.ReportMetric(per(Process()-m.process), process+"-cpu-µs/job")
	if pg := Postgres(m.pool, m.pidQuery, m.args...); m.pg >= 0 && pg >= 0 {
		b.ReportMetric(per(pg-m.pg), "postgres-cpu-µs/job")
	}
	if br := RabbitMQ(); m.broker >= 0 && br >= 0 {
		b.ReportMetric(per(br-m.broker), "rabbitmq-cpu-µs/job")
	}
}
