// Package replicastat writes this consumer replica's per-model snapshot to
// Postgres about every second (store.ReplicaSnapshot): admitted requests
// and tokens per second against the limits, 429s, the adaptive
// controller's state, the calibration, the quota share, calls in flight
// and jobs waiting. The console's overview reads only these rows, so it
// shows every replica, not the producer's own process
// (docs/design.md#console). It runs beside the worker, never on a job's
// path: one ticker goroutine reads the governors' snapshots.
package replicastat

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/quota"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/store"
)

// Store is where the snapshots go; *store.Store implements it.
type Store interface {
	PutReplicaSnapshots(ctx context.Context, snaps []store.ReplicaSnapshot) error
	DeleteReplicaSnapshots(ctx context.Context, replicaID string) error
}

var _ Store = (*store.Store)(nil)

// Governor is a model's admission pipeline; *ratecontrol.Governor
// implements it.
type Governor interface {
	Snapshot() ratecontrol.Snapshot
}

// Params builds a Reporter. Store, ReplicaID and Governors are required.
type Params struct {
	Store     Store
	ReplicaID string
	// Models are the configured models: their rpm and tpm are the
	// account's limits the console compares the replicas' sum against.
	Models map[string]config.Model
	// Governors are the replica's model governors, by model.
	Governors map[string]Governor
	// Waiting is the claimed jobs waiting for admission per model
	// (worker.Worker.Waiting); nil reads none.
	Waiting func() map[string]int
	// Shares is the replica's quota share per model
	// (quota.Coordinator.Shares); nil when the quota is not shared.
	Shares func() map[string]quota.Share
	// Interval between writes (default 1s).
	Interval time.Duration
	Logger   *slog.Logger
	// Now is the clock the rates are measured with (default time.Now).
	Now func() time.Time
}

// Reporter writes the snapshots. Run it in a goroutine the consumer owns.
type Reporter struct {
	p      Params
	prev   map[string]ratecontrol.Snapshot
	prevAt time.Time
}

// New checks p and builds the reporter.
func New(p Params) *Reporter {
	if p.Interval <= 0 {
		p.Interval = time.Second
	}
	if p.Logger == nil {
		p.Logger = slog.New(slog.DiscardHandler)
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	return &Reporter{p: p, prev: map[string]ratecontrol.Snapshot{}}
}

// Run writes a snapshot every interval until ctx ends, then deletes the
// replica's rows so the overview drops it at once (a replica that dies
// without doing so ages out: readers skip rows a few seconds old).
func (r *Reporter) Run(ctx context.Context) {
	t := time.NewTicker(r.p.Interval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			bye, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			if err := r.p.Store.DeleteReplicaSnapshots(bye, r.p.ReplicaID); err != nil {
				r.p.Logger.Warn("delete replica snapshots", "worker_id", r.p.ReplicaID, "error", err)
			}
			cancel()
			return
		case <-t.C:
			err := r.p.Store.PutReplicaSnapshots(ctx, r.Collect())
			// One warning per outage: the next success ends it.
			if err != nil && !failing && ctx.Err() == nil {
				r.p.Logger.Warn("write replica snapshots", "worker_id", r.p.ReplicaID, "error", err)
			}
			failing = err != nil
		}
	}
}

// Collect reads every governor and returns the rows to write; the rates
// are the counters' growth since the previous Collect (zero the first
// time).
func (r *Reporter) Collect() []store.ReplicaSnapshot {
	now := r.p.Now()
	elapsed := now.Sub(r.prevAt).Seconds()
	if r.prevAt.IsZero() {
		elapsed = 0
	}
	var waiting map[string]int
	if r.p.Waiting != nil {
		waiting = r.p.Waiting()
	}
	var shares map[string]quota.Share
	if r.p.Shares != nil {
		shares = r.p.Shares()
	}
	models := make([]string, 0, len(r.p.Governors))
	for m := range r.p.Governors {
		models = append(models, m)
	}
	slices.Sort(models)
	out := make([]store.ReplicaSnapshot, 0, len(models))
	for _, m := range models {
		s := r.p.Governors[m].Snapshot()
		row := rowOf(r.p.ReplicaID, m, r.p.Models[m], s)
		row.Waiting = waiting[m]
		if prev, ok := r.prev[m]; ok && elapsed > 0 {
			row.RequestsPerSec = float64(s.Granted-prev.Granted) / elapsed
			row.TokensPerSec = (s.Booked - prev.Booked) / elapsed
			row.RateLimitedPerSec = float64(s.RateLimited-prev.RateLimited) / elapsed
		}
		if sh, ok := shares[m]; ok {
			row.ShareRequests, row.ShareTokens = &sh.Requests, &sh.Tokens
		}
		r.prev[m] = s
		out = append(out, row)
	}
	r.prevAt = now
	return out
}

// rowOf is the parts of a row one governor snapshot and the model's
// configuration give.
func rowOf(replica, model string, cfg config.Model, s ratecontrol.Snapshot) store.ReplicaSnapshot {
	row := store.ReplicaSnapshot{
		ReplicaID: replica, Model: model, Strategy: string(s.Strategy),
		RPMLimit: perMinute(cfg.RPM, cfg.RPS), TPMLimit: perMinute(cfg.TPM, cfg.TPS),
		AppliedRPM: perMinute(s.Limits.RPM, s.Limits.RPS), AppliedTPM: perMinute(s.Limits.TPM, s.Limits.TPS),
		RateLimitedTotal: int64(s.RateLimited),
		InputRatio:       s.Calibration.InputRatio, OutputMean: s.Calibration.OutputMean,
		CalibrationSamples: s.Calibration.Samples,
		ConcurrencyLimit:   s.ConcurrencyLimit, InFlight: s.InFlight,
	}
	if s.Controller != nil {
		row.ControllerState = s.Controller.State.String()
	}
	return row
}

// perMinute is a limit given per minute or, failing that, per second, as
// a per-minute figure (0: none).
func perMinute(perMin, perSec float64) float64 {
	if perMin > 0 {
		return perMin
	}
	return perSec * 60
}
