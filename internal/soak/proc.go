package soak

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Proc is one role the soak runs as a real process (the producer, each
// consumer). A supervised Proc is started again a second after it exits,
// as an orchestrator would; every run of it is an Incarnation.
type Proc struct {
	Name      string
	Path      string
	Args      []string
	Env       []string // added to the soak's own environment
	Log       string   // file the incarnations' stdout and stderr are appended to
	Supervise bool

	mu      sync.Mutex
	cur     *Incarnation
	past    []*Incarnation
	stopped bool
	done    chan struct{}
}

// Incarnation is one run of a Proc: its pid, life and resident memory.
type Incarnation struct {
	Name    string
	PID     int
	Started time.Time
	Ended   time.Time // zero while it runs
	End     string    // why it ended
	Start   Memory    // mean of the samples in the rssWindow after warm-up; zero = died before
	Last    Memory    // mean of the samples in the last rssWindow
	// Witness marks the soak's own process: llmsim and the ledger live in
	// it, and the ledger holds a record per job, so it grows with the run
	// by design and is shown, not judged.
	Witness  bool
	killed   bool
	frozen   bool
	startSum Memory
	startN   int64
	recent   []rssSample
}

// rssWindow is how long Start and Last average over: a Go process's
// RSS moves by a few percent between garbage collections and scavenger
// rounds, so one sample at each end would measure the GC's phase, not a
// leak.
const rssWindow = time.Minute

type rssSample struct {
	at time.Time
	m  Memory
}

// Start runs the first incarnation and, when supervised, keeps one
// running until Stop. It returns once the first incarnation has started.
func (p *Proc) Start(ctx context.Context) error {
	p.done = make(chan struct{})
	first := make(chan error, 1)
	go func() {
		defer close(p.done)
		for n := 0; ; n++ {
			inc, wait, err := p.spawn()
			if n == 0 {
				first <- err
			}
			if err != nil {
				if n == 0 {
					return
				}
			} else {
				err := wait()
				p.ended(inc, err)
			}
			p.mu.Lock()
			stop := p.stopped || !p.Supervise
			p.mu.Unlock()
			if stop {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return <-first
}

func (p *Proc) spawn() (*Incarnation, func() error, error) {
	log, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a Ctrl-C on the soak reaches the soak only,
	// which then stops its children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	fmt.Fprintf(log, "\n=== soak: starting %s at %s\n", p.Name, time.Now().UTC().Format(time.RFC3339))
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, nil, fmt.Errorf("start %s: %w", p.Name, err)
	}
	inc := &Incarnation{Name: p.Name, PID: cmd.Process.Pid, Started: time.Now()}
	p.mu.Lock()
	p.cur = inc
	p.mu.Unlock()
	return inc, func() error { defer log.Close(); return cmd.Wait() }, nil
}

func (p *Proc) ended(inc *Incarnation, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	inc.Ended = time.Now()
	switch {
	case inc.killed:
		inc.End = "SIGKILL by the soak"
	case err != nil:
		inc.End = "exited: " + err.Error()
	default:
		inc.End = "exited 0"
	}
	p.past = append(p.past, inc)
	if p.cur == inc {
		p.cur = nil
	}
}

// PID is the running incarnation's pid, 0 when none runs.
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return 0
	}
	return p.cur.PID
}

// Kill sends SIGKILL to the running incarnation; a supervised Proc starts
// again a second later.
func (p *Proc) Kill() (pid int, err error) {
	p.mu.Lock()
	inc := p.cur
	if inc != nil {
		inc.killed = true
	}
	p.mu.Unlock()
	if inc == nil {
		return 0, fmt.Errorf("%s is not running", p.Name)
	}
	return inc.PID, syscall.Kill(inc.PID, syscall.SIGKILL)
}

// Stop ends supervision and the running incarnation: SIGTERM, then
// SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	p.mu.Lock()
	p.stopped = true
	inc := p.cur
	p.mu.Unlock()
	if p.done == nil {
		return
	}
	if inc != nil {
		_ = syscall.Kill(inc.PID, syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(grace):
		if inc != nil {
			_ = syscall.Kill(inc.PID, syscall.SIGKILL)
		}
		<-p.done
	}
}

// Sample reads the running incarnation's RSS: the samples of the
// rssWindow after warm make Start, those of the last rssWindow Last,
// until Freeze.
func (p *Proc) Sample(warm time.Duration) {
	p.mu.Lock()
	inc := p.cur
	p.mu.Unlock()
	if inc == nil {
		return
	}
	m, err := ReadMemory(inc.PID)
	if err != nil {
		return // it is exiting
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	inc.record(m, time.Now(), warm)
}

func (inc *Incarnation) record(m Memory, now time.Time, warm time.Duration) {
	if inc.frozen {
		return
	}
	if age := now.Sub(inc.Started); age >= warm && age < warm+rssWindow {
		inc.startSum = Memory{inc.startSum.RSS + m.RSS, inc.startSum.Anon + m.Anon}
		inc.startN++
		inc.Start = Memory{inc.startSum.RSS / inc.startN, inc.startSum.Anon / inc.startN}
	}
	inc.recent = append(inc.recent, rssSample{now, m})
	for len(inc.recent) > 0 && inc.recent[0].at.Before(now.Add(-rssWindow)) {
		inc.recent = inc.recent[1:]
	}
	var sum Memory
	for _, s := range inc.recent {
		sum = Memory{sum.RSS + s.m.RSS, sum.Anon + s.m.Anon}
	}
	n := int64(len(inc.recent))
	inc.Last = Memory{sum.RSS / n, sum.Anon / n}
}

// Freeze takes a last sample and keeps Last as it is from then on (the
// end of the load: the drain that follows is quieter).
func (p *Proc) Freeze(warm time.Duration) {
	p.Sample(warm)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil {
		p.cur.frozen = true
	}
}

// Incarnations returns every run so far, the running one last.
func (p *Proc) Incarnations() []Incarnation {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Incarnation
	for _, inc := range p.past {
		out = append(out, *inc)
	}
	if p.cur != nil {
		c := *p.cur
		c.End = "running at the end of the load"
		out = append(out, c)
	}
	return out
}

// LogPath is where a role's output goes under dir.
func LogPath(dir, name string) string { return filepath.Join(dir, name+".log") }
