package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ReplicaSnapshot is one consumer replica's view of one model, written
// about every second (migrations/00028_replica_snapshots.sql) and read by
// the console's overview. Rates are per second over the replica's last
// tick.
type ReplicaSnapshot struct {
	ReplicaID          string    `db:"replica_id" json:"replica_id"`
	Model              string    `db:"model" json:"model"`
	UpdatedAt          time.Time `db:"updated_at" json:"updated_at"`
	Strategy           string    `db:"strategy" json:"strategy"`
	ControllerState    string    `db:"controller_state" json:"controller_state"`
	RPMLimit           float64   `db:"rpm_limit" json:"rpm_limit"`
	TPMLimit           float64   `db:"tpm_limit" json:"tpm_limit"`
	AppliedRPM         float64   `db:"applied_rpm" json:"applied_rpm"`
	AppliedTPM         float64   `db:"applied_tpm" json:"applied_tpm"`
	RequestsPerSec     float64   `db:"requests_per_sec" json:"requests_per_sec"`
	TokensPerSec       float64   `db:"tokens_per_sec" json:"tokens_per_sec"`
	RateLimitedPerSec  float64   `db:"rate_limited_per_sec" json:"rate_limited_per_sec"`
	RateLimitedTotal   int64     `db:"rate_limited_total" json:"rate_limited_total"`
	InputRatio         float64   `db:"input_ratio" json:"input_ratio"`
	OutputMean         float64   `db:"output_mean" json:"output_mean"`
	CalibrationSamples int       `db:"calibration_samples" json:"calibration_samples"`
	ConcurrencyLimit   int       `db:"concurrency_limit" json:"concurrency_limit"`
	InFlight           int       `db:"in_flight" json:"in_flight"`
	Waiting            int       `db:"waiting" json:"waiting"`
	// ShareRequests and ShareTokens are the replica's quota share; nil
	// when the quota is not shared (quota.shared: false).
	ShareRequests *float64 `db:"share_requests" json:"share_requests"`
	ShareTokens   *float64 `db:"share_tokens" json:"share_tokens"`
}

// replicaSnapshotForget is how long a replica's rows outlive its last
// write before a writer deletes them; readers skip them much sooner.
const replicaSnapshotForget = time.Hour

// PutReplicaSnapshots upserts one replica's rows (stamped with the
// database's now()) and deletes the rows of replicas silent for an hour,
// in one round trip.
func (s *Store) PutReplicaSnapshots(ctx context.Context, snaps []ReplicaSnapshot) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	b := &pgx.Batch{}
	for _, r := range snaps {
		b.Queue(`INSERT INTO replica_snapshots (replica_id, model, updated_at, strategy, controller_state,
			rpm_limit, tpm_limit, applied_rpm, applied_tpm, requests_per_sec, tokens_per_sec, rate_limited_per_sec,
			rate_limited_total, input_ratio, output_mean, calibration_samples, concurrency_limit, in_flight, waiting,
			share_requests, share_tokens)
			VALUES ($1, $2, now(), $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)
			ON CONFLICT (replica_id, model) DO UPDATE SET updated_at = now(), strategy = EXCLUDED.strategy,
			controller_state = EXCLUDED.controller_state, rpm_limit = EXCLUDED.rpm_limit, tpm_limit = EXCLUDED.tpm_limit,
			applied_rpm = EXCLUDED.applied_rpm, applied_tpm = EXCLUDED.applied_tpm,
			requests_per_sec = EXCLUDED.requests_per_sec, tokens_per_sec = EXCLUDED.tokens_per_sec,
			rate_limited_per_sec = EXCLUDED.rate_limited_per_sec, rate_limited_total = EXCLUDED.rate_limited_total,
			input_ratio = EXCLUDED.input_ratio, output_mean = EXCLUDED.output_mean,
			calibration_samples = EXCLUDED.calibration_samples, concurrency_limit = EXCLUDED.concurrency_limit,
			in_flight = EXCLUDED.in_flight, waiting = EXCLUDED.waiting,
			share_requests = EXCLUDED.share_requests, share_tokens = EXCLUDED.share_tokens`,
			r.ReplicaID, r.Model, r.Strategy, r.ControllerState, r.RPMLimit, r.TPMLimit, r.AppliedRPM, r.AppliedTPM,
			r.RequestsPerSec, r.TokensPerSec, r.RateLimitedPerSec, r.RateLimitedTotal, r.InputRatio, r.OutputMean,
			r.CalibrationSamples, r.ConcurrencyLimit, r.InFlight, r.Waiting, r.ShareRequests, r.ShareTokens)
	}
	b.Queue(`DELETE FROM replica_snapshots WHERE updated_at < now() - make_interval(secs => $1)`, replicaSnapshotForget.Seconds())
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("write replica snapshots: %w", err)
	}
	return nil
}

// DeleteReplicaSnapshots removes a replica's rows: it is shutting down.
func (s *Store) DeleteReplicaSnapshots(ctx context.Context, replicaID string) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	if _, err := s.pool.Exec(ctx, `DELETE FROM replica_snapshots WHERE replica_id = $1`, replicaID); err != nil {
		return fmt.Errorf("delete replica snapshots of %s: %w", replicaID, err)
	}
	return nil
}

// ReplicaSnapshots returns the rows written within fresh of the database's
// now(), by model then replica: the replicas alive now.
func (s *Store) ReplicaSnapshots(ctx context.Context, fresh time.Duration) ([]ReplicaSnapshot, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rows, err := s.pool.Query(ctx, `SELECT * FROM replica_snapshots
		WHERE updated_at >= now() - make_interval(secs => $1) ORDER BY model, replica_id`, fresh.Seconds())
	if err != nil {
		return nil, fmt.Errorf("read replica snapshots: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[ReplicaSnapshot])
	if err != nil {
		return nil, fmt.Errorf("read replica snapshots: %w", err)
	}
	return out, nil
}
