package sim

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats is a snapshot of the simulator's accounting.
type Stats struct {
	Started time.Time             `json:"started"`
	Now     time.Time             `json:"now"`
	Models  map[string]ModelStats `json:"models"`
}

// ModelStats is one model's accounting since the simulator started.
type ModelStats struct {
	Limits ModelConfig `json:"limits"` // in force now
	// Requests counts chat requests that reached this model (valid JSON).
	Requests     int64 `json:"requests"`
	Admitted     int64 `json:"admitted"`
	InputTokens  int64 `json:"input_tokens"`  // charged for admitted requests
	OutputTokens int64 `json:"output_tokens"` // charged for admitted requests (0 for faulted ones)
	Tokens       int64 `json:"tokens"`        // input + output
	// RateLimited counts 429s by reason (rpm, tpm, rps, tps, burst).
	RateLimited      map[Reason]int64 `json:"rate_limited"`
	RateLimitedTotal int64            `json:"rate_limited_total"`
	TooLarge         int64            `json:"too_large"`      // 400: tokens above tpm/tps
	Queued           int64            `json:"queued"`         // burst-limited requests that waited (X-DashScope-Wait-Timeout)
	QueueAdmitted    int64            `json:"queue_admitted"` // of those, admitted after waiting
	Cancelled        int64            `json:"cancelled"`      // clients that left while queued
	// Faults counts injected faults: error_500, error_503, timeout, reset.
	Faults       map[string]int64 `json:"faults"`
	InFlight     int64            `json:"in_flight"`
	PeakInFlight int64            `json:"peak_in_flight"`
	// Overruns is the referee: how often admitted traffic exceeded a
	// configured rpm, tpm, rps or tps limit over its sliding window. The
	// simulator enforces the limits, so anything but 0 is a simulator bug.
	Overruns map[Reason]int64 `json:"overruns"`
	// Series holds one bucket per second since the simulator started (the
	// last day at least; trailing empty seconds omitted).
	Series []Second `json:"series,omitempty"`
}

// Second is one second of a model's traffic.
type Second struct {
	Unix        int64 `json:"t"`
	Requests    int64 `json:"requests"` // admitted
	Tokens      int64 `json:"tokens"`   // admitted
	RateLimited int64 `json:"rate_limited"`
}

// counters is a model's accounting, guarded by model.mu.
type counters struct {
	startSec                                int64
	requests, admitted, inTokens, outTokens int64
	rejected                                [7]int64 // by Reasons index
	tooLarge, queued, queueAdmitted         int64
	cancelled                               int64
	faults                                  [5]int64 // by fault
	overruns                                [4]int64 // by quotas index: rpm, tpm (audio seconds), rps, tps
	peakInflight                            int64
	series                                  []Second
}

// maxSeries bounds the per-second series (one day); older seconds are dropped.
const maxSeries = 86400

func (c *counters) bucket(ns int64) *Second {
	sec := ns / second
	if sec-c.startSec >= 2*maxSeries {
		newStart := sec - maxSeries
		drop := min(int64(len(c.series)), newStart-c.startSec)
		c.series = append(c.series[:0], c.series[drop:]...)
		c.startSec = newStart
	}
	i := max(0, sec-c.startSec)
	for int64(len(c.series)) <= i {
		c.series = append(c.series, Second{Unix: c.startSec + int64(len(c.series))})
	}
	return &c.series[i]
}

func (c *counters) admit(ns, in, out int64, f fault, inflight int64, queued bool) {
	c.admitted++
	c.inTokens += in
	c.outTokens += out
	c.faults[f]++
	c.peakInflight = max(c.peakInflight, inflight)
	if queued {
		c.queueAdmitted++
	}
	b := c.bucket(ns)
	b.Requests++
	b.Tokens += in + out
}

func (c *counters) reject(ns int64, r Reason) {
	for i, x := range Reasons {
		if x == r {
			c.rejected[i]++
		}
	}
	c.bucket(ns).RateLimited++
}

// Stats returns a snapshot of every model's accounting.
func (s *Simulator) Stats() Stats { return s.stats(true) }

func (s *Simulator) stats(series bool) Stats {
	st := Stats{Started: s.start, Now: s.clock.Now(), Models: map[string]ModelStats{}}
	s.mu.RLock()
	models := make([]*model, 0, len(s.models))
	for _, m := range s.models {
		models = append(models, m)
	}
	s.mu.RUnlock()
	for _, m := range models {
		m.mu.Lock()
		c := &m.c
		ms := ModelStats{
			Limits:   m.cfg,
			Requests: c.requests, Admitted: c.admitted,
			InputTokens: c.inTokens, OutputTokens: c.outTokens, Tokens: c.inTokens + c.outTokens,
			RateLimited: map[Reason]int64{}, TooLarge: c.tooLarge,
			Queued: c.queued, QueueAdmitted: c.queueAdmitted, Cancelled: c.cancelled,
			Faults:       map[string]int64{},
			InFlight:     m.inflight.Load(),
			PeakInFlight: c.peakInflight,
			Overruns:     map[Reason]int64{},
		}
		for i, r := range Reasons {
			ms.RateLimited[r] = c.rejected[i]
			ms.RateLimitedTotal += c.rejected[i]
		}
		for f := fault500; f <= faultReset; f++ {
			ms.Faults[f.String()] = c.faults[f]
		}
		for i, q := range m.cfg.quotas() {
			ms.Overruns[q.reason] = c.overruns[i]
		}
		if series {
			ms.Series = append([]Second(nil), c.series...)
		}
		m.mu.Unlock()
		st.Models[m.name] = ms
	}
	return st
}

// collector exposes Stats as Prometheus metrics, read at scrape time so the
// request path pays nothing for them.
type collector struct {
	s                                                   *Simulator
	requests, admitted, tokens, limited, faults, queued *prometheus.Desc
	inflight, overruns, limit                           *prometheus.Desc
}

func newCollector(s *Simulator) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("llmsim_"+name, help, append([]string{"model"}, labels...), nil)
	}
	return &collector{
		s:        s,
		requests: d("requests_total", "Chat requests that reached the model."),
		admitted: d("admitted_requests_total", "Requests admitted by the limits."),
		tokens:   d("admitted_tokens_total", "Tokens charged for admitted requests.", "kind"),
		limited:  d("rate_limited_total", "429 answers by limit.", "reason"),
		faults:   d("faults_total", "Injected faults by kind.", "kind"),
		queued:   d("queued_total", "Burst-limited requests queued by X-DashScope-Wait-Timeout."),
		inflight: d("inflight_requests", "Admitted requests not yet answered."),
		overruns: d("limit_overruns_total", "Admitted traffic above a configured limit over its window (must stay 0).", "limit"),
		limit:    d("limit", "Configured limit (0 = none).", "limit"),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.requests, c.admitted, c.tokens, c.limited, c.faults, c.queued, c.inflight, c.overruns, c.limit} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	cnt, gauge := prometheus.CounterValue, prometheus.GaugeValue
	for name, m := range c.s.stats(false).Models {
		ch <- prometheus.MustNewConstMetric(c.requests, cnt, float64(m.Requests), name)
		ch <- prometheus.MustNewConstMetric(c.admitted, cnt, float64(m.Admitted), name)
		ch <- prometheus.MustNewConstMetric(c.tokens, cnt, float64(m.InputTokens), name, "input")
		ch <- prometheus.MustNewConstMetric(c.tokens, cnt, float64(m.OutputTokens), name, "output")
		for r, v := range m.RateLimited {
			ch <- prometheus.MustNewConstMetric(c.limited, cnt, float64(v), name, string(r))
		}
		for k, v := range m.Faults {
			ch <- prometheus.MustNewConstMetric(c.faults, cnt, float64(v), name, k)
		}
		ch <- prometheus.MustNewConstMetric(c.queued, cnt, float64(m.Queued), name)
		ch <- prometheus.MustNewConstMetric(c.inflight, gauge, float64(m.InFlight), name)
		for r, v := range m.Overruns {
			ch <- prometheus.MustNewConstMetric(c.overruns, cnt, float64(v), name, string(r))
		}
		l := m.Limits
		for r, v := range map[Reason]int64{ReasonRPM: l.RPM, ReasonTPM: l.TPM, ReasonRPS: l.RPS, ReasonTPS: l.TPS, ReasonAudioSeconds: l.AudioSecondsPerMinute} {
			ch <- prometheus.MustNewConstMetric(c.limit, gauge, float64(v), name, string(r))
		}
	}
}

// SlidingMinute is the most tokens and requests admitted in any 60
// consecutive seconds of series: a check of a minute's limits from
// outside the simulator, beside its own referee (Overruns).
func SlidingMinute(series []Second) (tokens, requests int64) {
	per := map[int64]Second{}
	lo, hi := int64(-1), int64(-1)
	for _, s := range series {
		per[s.Unix] = s
		if lo < 0 || s.Unix < lo {
			lo = s.Unix
		}
		hi = max(hi, s.Unix)
	}
	var t, r int64
	for s := lo; s <= hi; s++ {
		t += per[s].Tokens
		r += per[s].Requests
		if old, ok := per[s-60]; ok {
			t -= old.Tokens
			r -= old.Requests
		}
		tokens, requests = max(tokens, t), max(requests, r)
	}
	return tokens, requests
}
