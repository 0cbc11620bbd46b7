package cpustat

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Watch attributes the machine's CPU time to commands over a window: which
// of Postgres, the consumer, the broker, a load generator and the rest a
// job's cost lands in, where a per-process benchmark sees only its own
// share. Each process counts with its own time (utime+stime, not its
// reaped children's), up to the last Sample that saw it, so a process that
// exits inside the window still counts. Linux only (/proc).
type Watch struct {
	first, last map[int]procTime
	latest      map[int]procTime // the last Sample's processes
	m0, m1      machineTimes
}

type procTime struct {
	comm  string
	ticks int64
}

// machineTimes is /proc/stat's first line: all ticks, idle+iowait ticks,
// and the ticks spent in interrupts (irq+softirq), which no process's
// time includes: on a machine where every service talks over loopback,
// softirq is where the network stack's receive side runs.
type machineTimes struct{ total, idle, irq int64 }

// NewWatch takes the window's first sample.
func NewWatch() (*Watch, error) {
	procs, err := readProcs()
	if err != nil {
		return nil, err
	}
	m, err := readMachine()
	if err != nil {
		return nil, err
	}
	return &Watch{first: procs, last: clone(procs), latest: procs, m0: m, m1: m}, nil
}

// Sample reads every process again; call it often enough (every 100–200
// ms) that short-lived processes are seen at least once before they exit.
func (w *Watch) Sample() error {
	procs, err := readProcs()
	if err != nil {
		return err
	}
	m, err := readMachine()
	if err != nil {
		return err
	}
	for pid, p := range procs {
		w.last[pid] = p
	}
	w.latest, w.m1 = procs, m
	return nil
}

// Alive reports whether a process named comm was running at the last Sample.
func (w *Watch) Alive(comm string) bool { return anyNamed(w.latest, comm) }

// Running reports whether a process named comm runs now.
func Running(comm string) bool {
	procs, err := readProcs()
	return err == nil && anyNamed(procs, comm)
}

func anyNamed(procs map[int]procTime, comm string) bool {
	for _, p := range procs {
		if p.comm == comm {
			return true
		}
	}
	return false
}

// Share is one command's CPU time over a Watch's window.
type Share struct {
	Command string
	CPU     time.Duration
}

// Busy is the machine's non-idle CPU time (all cores) between the first
// and the last Sample.
func (w *Watch) Busy() time.Duration {
	busy := (w.m1.total - w.m1.idle) - (w.m0.total - w.m0.idle)
	return time.Duration(busy) * time.Second / userHZ
}

// Interrupts is the machine's irq+softirq time between the first and the
// last Sample: busy time that no command's row holds.
func (w *Watch) Interrupts() time.Duration {
	return time.Duration(w.m1.irq-w.m0.irq) * time.Second / userHZ
}

// ByCommand sums the window's CPU time by command, largest first. Kernel
// workers (kworker/…) count as one command.
func (w *Watch) ByCommand() []Share {
	sum := map[string]int64{}
	for pid, p := range w.last {
		d := p.ticks
		if f, ok := w.first[pid]; ok && f.comm == p.comm {
			d -= f.ticks
		}
		if d > 0 {
			sum[p.comm] += d
		}
	}
	out := make([]Share, 0, len(sum))
	for c, t := range sum {
		out = append(out, Share{Command: c, CPU: time.Duration(t) * time.Second / userHZ})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].CPU != out[j].CPU {
			return out[i].CPU > out[j].CPU
		}
		return out[i].Command < out[j].Command
	})
	return out
}

const userHZ = 100 // USER_HZ: /proc's clock ticks per second on Linux

func clone(m map[int]procTime) map[int]procTime {
	c := make(map[int]procTime, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func readProcs() (map[int]procTime, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("cpustat: machine-wide CPU needs Linux's /proc: %w", err)
	}
	out := make(map[int]procTime, len(entries))
	buf := make([]byte, 0, 1024)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue // not a process
		}
		buf, err = readInto(buf[:0], "/proc/"+e.Name()+"/stat")
		if err != nil {
			continue // exited since the listing
		}
		if p, ok := parseStat(buf); ok {
			out[pid] = p
		}
	}
	return out, nil
}

// readInto reads a small /proc file into buf without os.ReadFile's stat.
func readInto(buf []byte, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return buf, err
	}
	defer f.Close()
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF || n == 0 {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// parseStat reads comm and utime+stime from /proc/<pid>/stat. The comm
// sits in parentheses and may itself hold spaces or parentheses, so the
// fields are counted from the last ')'.
func parseStat(data []byte) (procTime, bool) {
	open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || end < open || end+2 > len(data) {
		return procTime{}, false
	}
	comm := string(data[open+1 : end])
	if strings.HasPrefix(comm, "kworker/") {
		comm = "kworker"
	}
	var ticks int64
	field := 0
	for rest := data[end+2:]; len(rest) > 0 && field <= 12; field++ {
		i := bytes.IndexByte(rest, ' ')
		if i < 0 {
			i = len(rest)
		}
		if field == 11 || field == 12 { // utime, stime
			v, err := strconv.ParseInt(string(rest[:i]), 10, 64)
			if err != nil {
				return procTime{}, false
			}
			ticks += v
		}
		rest = rest[min(i+1, len(rest)):]
	}
	if field <= 12 {
		return procTime{}, false
	}
	return procTime{comm: comm, ticks: ticks}, true
}

func readMachine() (machineTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return machineTimes{}, fmt.Errorf("cpustat: %w", err)
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return machineTimes{}, fmt.Errorf("cpustat: read /proc/stat: %w", err)
	}
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return machineTimes{}, fmt.Errorf("cpustat: /proc/stat starts %q", line)
	}
	var m machineTimes
	for i, s := range fields[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return machineTimes{}, fmt.Errorf("cpustat: /proc/stat field %d: %w", i+1, err)
		}
		if i >= 8 { // guest and guest_nice are already inside user and nice
			break
		}
		m.total += v
		switch i {
		case 3, 4: // idle, iowait
			m.idle += v
		case 5, 6: // irq, softirq
			m.irq += v
		}
	}
	return m, nil
}
