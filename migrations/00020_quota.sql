-- +goose Up
-- quota_members: one row per (model, consumer replica) sharing a provider
-- quota, written only by internal/quota. A row is a lease: it lives until
-- expires_at (database time) unless renewed. demand_* is what the replica
-- wanted over the last interval (per second, capped at the model's limit);
-- share_* is the fraction of the model's limits the replica has APPLIED to
-- its governor. Invariant kept by quota.Coordinator: per model and unit,
-- sum(share_*) over live rows <= 1, because a replica raises its share only
-- inside a transaction holding the model's advisory lock and only into
-- headroom that no other row claims.
CREATE TABLE quota_members (
    model           text             NOT NULL,
    replica_id      text             NOT NULL,
    demand_requests double precision NOT NULL DEFAULT 0 CHECK (demand_requests >= 0),
    demand_tokens   double precision NOT NULL DEFAULT 0 CHECK (demand_tokens >= 0),
    share_requests  double precision NOT NULL DEFAULT 0 CHECK (share_requests >= 0 AND share_requests <= 1),
    share_tokens    double precision NOT NULL DEFAULT 0 CHECK (share_tokens >= 0 AND share_tokens <= 1),
    joined_at       timestamptz      NOT NULL DEFAULT now(),
    renewed_at      timestamptz      NOT NULL DEFAULT now(),
    expires_at      timestamptz      NOT NULL,
    PRIMARY KEY (model, replica_id),
    CHECK (expires_at >= renewed_at)
);

CREATE INDEX quota_members_expires ON quota_members (expires_at);

-- quota_penalties: 429s seen by one replica, read by the others (seq > last
-- seen) so every replica's adaptive controller drains. Pruned after a few
-- minutes by the coordinators themselves.
CREATE TABLE quota_penalties (
    seq            bigserial   PRIMARY KEY,
    model          text        NOT NULL,
    replica_id     text        NOT NULL,
    kind           text        NOT NULL,
    code           text        NOT NULL DEFAULT '',
    retry_after_ms bigint      NOT NULL DEFAULT 0 CHECK (retry_after_ms >= 0),
    at             timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX quota_penalties_at ON quota_penalties (at);

-- +goose Down
DROP TABLE quota_penalties;
DROP TABLE quota_members;
