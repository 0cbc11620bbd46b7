package worker

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

// cpuMeter measures CPU time per job, which moves less with the machine's
// load than jobs/s: this process's (the consumer, the simulator and the
// drivers, from rusage), its Postgres backends' (those connected to the
// test's own database, from /proc) and the RabbitMQ node's (beam.smp, from
// /proc; the node is shared, so other work on it counts too). A figure
// that cannot be read (services elsewhere) is not reported.
type cpuMeter struct {
	process, pg, broker time.Duration
	pool                *pgxpool.Pool
}

func startCPU(pool *pgxpool.Pool) *cpuMeter {
	return &cpuMeter{process: processCPU(), pg: postgresCPU(pool), broker: brokerCPU(), pool: pool}
}

func (m *cpuMeter) report(b *testing.B, jobs int) {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(jobs) }
	b.ReportMetric(per(processCPU()-m.process), "consumer-cpu-µs/job")
	if pg := postgresCPU(m.pool); m.pg >= 0 && pg >= 0 {
		b.ReportMetric(per(pg-m.pg), "postgres-cpu-µs/job")
	}
	if br := brokerCPU(); m.broker >= 0 && br >= 0 {
		b.ReportMetric(per(br-m.broker), "rabbitmq-cpu-µs/job")
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the user+system CPU time of a process, or -1.
func procCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
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

// postgresCPU sums the CPU time of the backends connected to the pool's
// database, or -1 when Postgres runs elsewhere.
func postgresCPU(pool *pgxpool.Pool) time.Duration {
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return -1
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return -1
	}
	var total time.Duration
	for _, pid := range pids {
		d := procCPU(int(pid))
		if d < 0 {
			return -1
		}
		total += d
	}
	return total
}

// brokerCPU is the CPU time of the local RabbitMQ node, or -1.
func brokerCPU() time.Duration {
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range comms {
		if data, err := os.ReadFile(c); err == nil && strings.TrimSpace(string(data)) == "beam.smp" {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(c)))
			return procCPU(pid)
		}
	}
	return -1
}
