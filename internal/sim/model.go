package sim

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// model is one simulated model: its limits, admission history and counters.
type model struct {
	name     string
	mu       sync.Mutex
	cfg      ModelConfig // with defaults; Latency and Output resolved
	log      eventLog
	c        counters
	inflight atomic.Int64
}

// admission is the outcome of model.admit.
type admission struct {
	refused   decision // refused.reason != "" on a 429
	tooLarge  error    // the request can never fit a token limit
	cancelled bool     // the client left (or the simulator closed) while queued
	inflight  int64    // in-flight requests including this one, when admitted
	headers   rateHeaders
}

func (a admission) admitted() bool {
	return a.refused.reason == "" && a.tooLarge == nil && !a.cancelled
}

// rateHeaders are the x-ratelimit-* values at the decision.
type rateHeaders struct {
	reqSet, tokSet bool
	limReq, remReq int64
	resetReq       time.Duration
	limTok, remTok int64
	resetTok       time.Duration
}

func (m *model) config() ModelConfig {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cfg
}

func (m *model) setConfig(cfg ModelConfig) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cfg = cfg
}

// admit checks a request of in+out tokens against the model's limits and
// records it when admitted. A request refused only by the burst rule is
// queued for up to wait (X-DashScope-Wait-Timeout) when wait is positive
// and below the model's maximum response time; every other refusal is
// immediate.
func (m *model) admit(ctx context.Context, s *Simulator, in, out int64, f fault, wait time.Duration) admission {
	charge := in + out
	var deadline time.Time
	queued, counted := false, false
	for {
		now := s.clock.Now()
		m.mu.Lock()
		ns := max(now.UnixNano(), m.log.last())
		if !counted {
			counted = true
			m.c.requests++
		}
		cfg := m.cfg
		if err := cfg.tooLarge(charge); err != nil {
			m.c.tooLarge++
			m.mu.Unlock()
			return admission{tooLarge: err}
		}
		m.log.evict(ns - cfg.horizon())
		checked := charge
		if cfg.ChargeAtAdmission {
			checked = in
		}
		d := check(&m.log, cfg, ns, checked)
		if d.reason == "" {
			m.log.push(ns, charge)
			a := admission{inflight: m.inflight.Add(1)}
			m.c.admit(ns, in, out, f, a.inflight, queued)
			for i, o := range overruns(&m.log, cfg, ns) {
				if o {
					m.c.overruns[i]++
				}
			}
			if s.cfg.Headers.RateLimit {
				a.headers = rateHeadersAt(&m.log, cfg, ns)
			}
			m.mu.Unlock()
			return a
		}
		canQueue := d.reason == ReasonBurst && wait > 0 && wait < cfg.MaxResponseTime.D()
		if canQueue && !queued {
			queued, deadline = true, now.Add(wait)
			m.c.queued++
		}
		remaining := deadline.Sub(now)
		if !canQueue || remaining <= 0 {
			m.c.reject(ns, d.reason)
			a := admission{refused: d}
			if s.cfg.Headers.RateLimit {
				a.headers = rateHeadersAt(&m.log, cfg, ns)
			}
			m.mu.Unlock()
			return a
		}
		m.mu.Unlock()
		if !s.sleep(ctx, min(d.wait, remaining)) {
			m.mu.Lock()
			m.c.cancelled++
			m.mu.Unlock()
			return admission{cancelled: true}
		}
	}
}

// done marks an admitted request finished.
func (m *model) done() { m.inflight.Add(-1) }

func rateHeadersAt(l *eventLog, cfg ModelConfig, now int64) rateHeaders {
	var h rateHeaders
	reset := func() time.Duration {
		if l.n == 0 {
			return 0
		}
		return time.Duration(max(0, l.last()+minute-now))
	}
	if cfg.RPM > 0 {
		_, c, _ := l.window(now, minute)
		h.reqSet, h.limReq, h.remReq, h.resetReq = true, cfg.RPM, max(0, cfg.RPM-c), reset()
	}
	if cfg.TPM > 0 {
		_, _, t := l.window(now, minute)
		h.tokSet, h.limTok, h.remTok, h.resetTok = true, cfg.TPM, max(0, cfg.TPM-t), reset()
	}
	return h
}
