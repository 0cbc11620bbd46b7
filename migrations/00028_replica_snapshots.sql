-- +goose Up
-- Replica snapshots (docs/design.md#console): every consumer replica
-- upserts one row per model about every second with what its governor and
-- quota share are doing, so the console's overview shows every replica
-- rather than the producer's own process. Rates are measured by the
-- replica over its last tick; rows whose updated_at stops moving belong to
-- a replica that is gone: readers skip them and writers delete them after
-- an hour. The table holds (replicas × models) rows and is never on a
-- job's path.
CREATE TABLE replica_snapshots (
    replica_id         text             NOT NULL,
    model              text             NOT NULL,
    updated_at         timestamptz      NOT NULL,
    strategy           text             NOT NULL,
    -- probing, hold or drain (internal/ratecontrol/flow); '' without a controller.
    controller_state   text             NOT NULL,
    -- the model's configured limits (the account's), and this replica's
    -- applied part of them (its quota share).
    rpm_limit          double precision NOT NULL,
    tpm_limit          double precision NOT NULL,
    applied_rpm        double precision NOT NULL,
    applied_tpm        double precision NOT NULL,
    requests_per_sec   double precision NOT NULL,
    tokens_per_sec     double precision NOT NULL,
    rate_limited_per_sec double precision NOT NULL,
    rate_limited_total bigint           NOT NULL,
    input_ratio        double precision NOT NULL,
    output_mean        double precision NOT NULL,
    calibration_samples integer         NOT NULL,
    concurrency_limit  integer          NOT NULL,
    in_flight          integer          NOT NULL,
    waiting            integer          NOT NULL,
    -- the replica's quota share (internal/quota); NULL when quota.shared is off.
    share_requests     double precision,
    share_tokens       double precision,
    PRIMARY KEY (replica_id, model)
);

-- +goose Down
DROP TABLE replica_snapshots;
