package api

import (
	"context"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/store"
)

// The console's overview (docs/design.md#console): the back-pressure
// status the monitor keeps, and per model what the consumer replicas
// write to replica_snapshots (internal/replicastat), summed over the
// replicas alive, with a series of the last 15 minutes. The producer reads
// the table once a second for every viewer together (overviewHub), and
// GET /v1/overview/stream pushes the document to each viewer as
// server-sent events.

// snapshotReader is the part of *store.Store that reads replica
// snapshots; a store without it gives an overview without models.
type snapshotReader interface {
	ReplicaSnapshots(ctx context.Context, fresh time.Duration) ([]store.ReplicaSnapshot, error)
}

const (
	// replicaFresh is how old a replica's row may be and still count: a
	// few missed writes, not a replica that is gone.
	replicaFresh = 5 * time.Second
	// seriesLength is the points each model's series keeps: 15 minutes of
	// one-second ticks.
	seriesLength = 15 * 60
)

// Overview is the document of GET /v1/overview and of each event of
// GET /v1/overview/stream.
type Overview struct {
	// Status is what GET /v1/status answers the same key.
	Status Status `json:"status"`
	// Models is every model a live replica reports, by name; only for an
	// admin key, since the load of a model is every tenant's together.
	Models    []ModelOverview `json:"models"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// ModelOverview is one model summed over the live replicas.
type ModelOverview struct {
	Model string `json:"model"`
	// RPMLimit and TPMLimit are the configured (account) limits per minute;
	// 0 when unset.
	RPMLimit          float64 `json:"rpm_limit"`
	TPMLimit          float64 `json:"tpm_limit"`
	RequestsPerSec    float64 `json:"requests_per_sec"`
	TokensPerSec      float64 `json:"tokens_per_sec"`
	RateLimitedPerSec float64 `json:"rate_limited_per_sec"`
	RateLimitedTotal  int64   `json:"rate_limited_total"`
	InFlight          int     `json:"in_flight"`
	Waiting           int     `json:"waiting"`
	// ControllerState is the most cautious state among the replicas'
	// controllers: drain over hold over probing ("" with none).
	ControllerState string `json:"controller_state"`
	// InputRatio and OutputMean are the calibration, averaged over the
	// replicas by their samples.
	InputRatio float64                 `json:"input_ratio"`
	OutputMean float64                 `json:"output_mean"`
	Replicas   []store.ReplicaSnapshot `json:"replicas"`
	Series     Series                  `json:"series"`
}

// Series is a model's last 15 minutes, one point a second while the
// producer has been reading: Unix seconds and the summed rates.
type Series struct {
	T           []int64   `json:"t"`
	Requests    []float64 `json:"requests_per_sec"`
	Tokens      []float64 `json:"tokens_per_sec"`
	RateLimited []float64 `json:"rate_limited_per_sec"`
}

func (s *Series) add(t int64, req, tok, limited float64) {
	if n := len(s.T); n > 0 && s.T[n-1] == t {
		s.Requests[n-1], s.Tokens[n-1], s.RateLimited[n-1] = req, tok, limited
		return
	}
	s.T, s.Requests = append(s.T, t), append(s.Requests, req)
	s.Tokens, s.RateLimited = append(s.Tokens, tok), append(s.RateLimited, limited)
	if over := len(s.T) - seriesLength; over > 0 {
		s.T, s.Requests = s.T[over:], s.Requests[over:]
		s.Tokens, s.RateLimited = s.Tokens[over:], s.RateLimited[over:]
	}
}

func (s Series) clone() Series {
	return Series{T: append([]int64(nil), s.T...), Requests: append([]float64(nil), s.Requests...),
		Tokens: append([]float64(nil), s.Tokens...), RateLimited: append([]float64(nil), s.RateLimited...)}
}

// stateRank orders controller states by caution.
var stateRank = map[string]int{"": 0, "probing": 1, "hold": 2, "drain": 3}

// summarize sums one model's replica rows (sorted by model) into its
// overview, without the series.
func summarize(model string, rows []store.ReplicaSnapshot) ModelOverview {
	mo := ModelOverview{Model: model, Replicas: rows}
	var samples float64
	for _, r := range rows {
		mo.RPMLimit, mo.TPMLimit = max(mo.RPMLimit, r.RPMLimit), max(mo.TPMLimit, r.TPMLimit)
		mo.RequestsPerSec += r.RequestsPerSec
		mo.TokensPerSec += r.TokensPerSec
		mo.RateLimitedPerSec += r.RateLimitedPerSec
		mo.RateLimitedTotal += r.RateLimitedTotal
		mo.InFlight += r.InFlight
		mo.Waiting += r.Waiting
		if stateRank[r.ControllerState] > stateRank[mo.ControllerState] {
			mo.ControllerState = r.ControllerState
		}
		w := float64(max(r.CalibrationSamples, 1))
		mo.InputRatio += r.InputRatio * w
		mo.OutputMean += r.OutputMean * w
		samples += w
	}
	if samples > 0 {
		mo.InputRatio /= samples
		mo.OutputMean /= samples
	}
	return mo
}

// overviewHub reads the replica snapshots once a second and keeps each
// model's series; every viewer's stream reads its latest state.
type overviewHub struct {
	read snapshotReader
	now  func() time.Time

	mu     sync.Mutex
	models []ModelOverview
	series map[string]*Series
}

func newOverviewHub(st Store, now func() time.Time) *overviewHub {
	h := &overviewHub{now: now, series: map[string]*Series{}}
	h.read, _ = st.(snapshotReader)
	return h
}

// refresh reads the live replicas' rows and appends a point to each
// model's series.
func (h *overviewHub) refresh(ctx context.Context) error {
	if h.read == nil {
		return nil
	}
	rows, err := h.read.ReplicaSnapshots(ctx, replicaFresh)
	if err != nil {
		return err
	}
	var models []ModelOverview
	for start := 0; start < len(rows); {
		end := start
		for end < len(rows) && rows[end].Model == rows[start].Model {
			end++
		}
		models = append(models, summarize(rows[start].Model, rows[start:end]))
		start = end
	}
	t := h.now().Unix()
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	for i := range models {
		m := &models[i]
		s := h.series[m.Model]
		if s == nil {
			s = &Series{}
			h.series[m.Model] = s
		}
		s.add(t, m.RequestsPerSec, m.TokensPerSec, m.RateLimitedPerSec)
		seen[m.Model] = true
	}
	// A model no replica reports any more reads 0 until its series ages out.
	for name, s := range h.series {
		if !seen[name] {
			s.add(t, 0, 0, 0)
		}
	}
	h.models = models
	return nil
}

// snapshot is the models with their series, copied for one viewer.
func (h *overviewHub) snapshot() []ModelOverview {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]ModelOverview, len(h.models))
	for i, m := range h.models {
		m.Series = h.series[m.Model].clone()
		out[i] = m
	}
	return out
}

// run refreshes every second until ctx ends.
func (h *overviewHub) run(ctx context.Context, warn func(error)) {
	if h.read == nil {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	failing := false
	for {
		err := h.refresh(ctx)
		// One warning per outage: the next success ends it.
		if err != nil && !failing && ctx.Err() == nil {
			warn(err)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
