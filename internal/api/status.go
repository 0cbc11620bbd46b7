package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Back-pressure states.
const (
	StateOK        = "ok"
	StateThrottled = "throttled"
	StateFull      = "full"
)

// drainWindow is how far back the drain rate looks.
const drainWindow = time.Minute

// noDrainRetryAfter is the Retry-After when nothing has drained lately: the
// guide's "the service typically resumes within one minute"
// (docs/design.md#provider-limits), halved.
const noDrainRetryAfter = 30 * time.Second

// drainEvery is how often the background refresh re-measures the drain
// rate (a count over the last minute of completions), less often than the
// backlog.
const drainEvery = 5 * time.Second

// maxRetryAfter caps Retry-After.
const maxRetryAfter = 10 * time.Minute

// Status is the back-pressure document of GET /v1/status and llmq.status.
type Status struct {
	State string `json:"state"`
	// Backlog per lane: the larger of the broker's depth and the jobs
	// Postgres holds as queued, retrying or running.
	Backlog map[job.Priority]int64 `json:"backlog"`
	Total   int64                  `json:"total"`
	// DrainRate is jobs finished per second over the last minute.
	DrainRate float64 `json:"drain_rate"`
	// ETASeconds is Total/DrainRate; null while nothing drains.
	ETASeconds *float64  `json:"eta_seconds"`
	SoftLimit  int64     `json:"soft_limit"`
	HardLimit  int64     `json:"hard_limit"`
	UpdatedAt  time.Time `json:"updated_at"`
}

func stateFor(total, soft, hard int64) string {
	switch {
	case total >= hard:
		return StateFull
	case total > soft:
		return StateThrottled
	}
	return StateOK
}

// retryAfter is how long until the backlog has drained by excess jobs at
// drainRate, clamped to [1s, maxRetryAfter].
func retryAfter(excess int64, drainRate float64) time.Duration {
	if drainRate <= 0 {
		return noDrainRetryAfter
	}
	d := time.Duration(math.Ceil(float64(excess)/drainRate)) * time.Second
	return min(max(d, time.Second), maxRetryAfter)
}

// monitor keeps the cached status and admits submissions against it. Jobs
// admitted since the last refresh count on top of the cached backlog, so a
// burst between two refreshes cannot overshoot the hard limit.
type monitor struct {
	store     Store
	inspector broker.Inspector
	pub       broker.Publisher
	soft      int64
	hard      int64
	interval  time.Duration
	now       func() time.Time
	log       *slog.Logger
	metrics   *metrics
	// finishRate, when set, is the jobs finished per second as the
	// job-finished listener hears them (every lane together): counting
	// notifications costs nothing, where store.DrainRate scans the jobs
	// table's completed_at, which no index covers.
	finishRate func() float64

	mu      sync.Mutex
	status  Status
	pending int64 // admitted since the snapshot was taken
	drainAt time.Time
}

func (m *monitor) snapshot() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.status
}

// admission is the verdict on n new jobs.
type admission struct {
	ok         bool
	backlog    int64
	retryAfter time.Duration
}

// admit reserves room for n jobs; release undoes it for jobs that were not
// created after all.
func (m *monitor) admit(n int64) admission {
	m.mu.Lock()
	defer m.mu.Unlock()
	backlog := m.status.Total + m.pending
	if backlog+n > m.hard {
		excess := backlog + n - m.hard
		return admission{backlog: backlog, retryAfter: retryAfter(excess, m.status.DrainRate)}
	}
	m.pending += n
	return admission{ok: true, backlog: backlog + n}
}

func (m *monitor) release(n int64) {
	m.mu.Lock()
	m.pending -= n
	m.mu.Unlock()
}

// refresh measures the backlog and the drain rate (from the listener, or,
// without one, from Postgres when forced or older than drainEvery) and
// replaces the cached status. It reports whether the
// state changed.
func (m *monitor) refresh(ctx context.Context, force bool) (Status, bool, error) {
	m.mu.Lock()
	pendingAtStart := m.pending
	drain, drainAt := m.status.DrainRate, m.drainAt
	m.mu.Unlock()

	backlog := make(map[job.Priority]int64, len(job.Priorities))
	pg, err := m.store.Backlog(ctx)
	if err != nil {
		return Status{}, false, fmt.Errorf("status: postgres backlog: %w", err)
	}
	var total int64
	for _, lane := range job.Priorities {
		depth, err := m.inspector.Depth(ctx, lane)
		if err != nil {
			return Status{}, false, fmt.Errorf("status: broker depth of lane %s: %w", lane, err)
		}
		backlog[lane] = max(pg[lane], depth)
		total += backlog[lane]
	}
	now := m.now()
	if m.finishRate != nil {
		drain, drainAt = m.finishRate(), now
	} else if force || now.Sub(drainAt) >= drainEvery {
		if drain, err = m.store.DrainRate(ctx, drainWindow); err != nil {
			return Status{}, false, fmt.Errorf("status: drain rate: %w", err)
		}
		drainAt = now
	}
	st := Status{
		State:     stateFor(total, m.soft, m.hard),
		Backlog:   backlog,
		Total:     total,
		DrainRate: drain,
		SoftLimit: m.soft,
		HardLimit: m.hard,
		UpdatedAt: now.UTC(),
	}
	if drain > 0 {
		eta := math.Round(float64(total)/drain*10) / 10
		st.ETASeconds = &eta
	} else if total == 0 {
		zero := 0.0
		st.ETASeconds = &zero
	}

	m.mu.Lock()
	changed := st.State != m.status.State
	m.status = st
	m.drainAt = drainAt
	// Jobs admitted while we measured may be missing from this snapshot.
	m.pending -= pendingAtStart
	m.mu.Unlock()
	m.metrics.observeStatus(st)
	return st, changed, nil
}

func (m *monitor) publish(ctx context.Context, st Status) {
	body, err := json.Marshal(st)
	if err != nil {
		m.log.Error("encode status", "error", err)
		return
	}
	if err := m.pub.PublishStatus(ctx, body); err != nil {
		m.log.Warn("publish status", "error", err, "state", st.State)
	}
}

// run refreshes every second and publishes on every state change and every
// interval, until ctx ends.
func (m *monitor) run(ctx context.Context) {
	refreshEvery := time.Second
	refreshTick := time.NewTicker(refreshEvery)
	defer refreshTick.Stop()
	publishTick := time.NewTicker(m.interval)
	defer publishTick.Stop()

	st, _, err := m.refresh(ctx, true)
	if err != nil {
		m.log.Warn("refresh back-pressure status", "error", err)
	} else {
		m.publish(ctx, st)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-refreshTick.C:
			st, changed, err := m.refresh(ctx, false)
			if err != nil {
				if ctx.Err() == nil {
					m.log.Warn("refresh back-pressure status", "error", err)
				}
				continue
			}
			if changed {
				m.log.Info("back-pressure state changed", "state", st.State, "backlog", st.Total, "drain_rate", st.DrainRate)
				m.publish(ctx, st)
			}
		case <-publishTick.C:
			m.publish(ctx, m.snapshot())
		}
	}
}
