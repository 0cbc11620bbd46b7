-- +goose Up
-- quota_learned: what each consumer replica's governor has learned of a
-- model (ratecontrol.Learned), written by internal/quota with the lease
-- renewal and read by a replica joining, which starts from it instead of
-- cold. calibration is ratecontrol.Calibration as JSON (input-token ratio,
-- the window of last output lengths and latencies); samples is its number
-- of settled calls, for choosing the most informed row; rate_scale is
-- auto's rate cap (the fraction of the configured rate the provider
-- admitted after unforeseen 429s). Rows outlive the leases, so a replica
-- started after all others stopped still finds the calibration; the
-- coordinators prune rows not renewed for an hour.
CREATE TABLE quota_learned (
    model       text             NOT NULL,
    replica_id  text             NOT NULL,
    samples     integer          NOT NULL CHECK (samples >= 0),
    rate_scale  double precision NOT NULL DEFAULT 1 CHECK (rate_scale > 0 AND rate_scale <= 1),
    calibration jsonb            NOT NULL,
    updated_at  timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (model, replica_id)
);

CREATE INDEX quota_learned_updated ON quota_learned (updated_at);

-- +goose Down
DROP TABLE quota_learned;
