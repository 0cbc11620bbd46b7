-- +goose Up
-- Fair share across tenants (docs/design.md#tenants). A consumer keeps at
-- most worker.tenant_hold jobs of one tenant, model and lane waiting for
-- admission; the tenant's further messages are acked and their rows
-- *parked*: queued, no message (enqueued_at NULL) and parked_at set. A
-- consumer with room for that tenant publishes its parked rows again,
-- oldest first. So a tenant's flood leaves the lanes as fast as the
-- consumers can read it and waits in Postgres, where it cannot delay the
-- messages of other tenants that arrive behind it.
ALTER TABLE jobs ADD COLUMN parked_at timestamptz;

-- Consumers find and take parked rows per (tenant, model, lane) in order.
CREATE INDEX jobs_parked_idx ON jobs (tenant, model, priority, created_at)
    WHERE parked_at IS NOT NULL AND status = 'queued';

-- A parked row has no message on purpose: the reconciler's sweep of rows
-- that need one must not see it, or it would publish the whole flood back.
DROP INDEX jobs_unenqueued_idx;
CREATE INDEX jobs_unenqueued_idx ON jobs (priority, created_at)
    WHERE enqueued_at IS NULL AND parked_at IS NULL AND status IN ('queued', 'retrying');

-- +goose Down
DROP INDEX jobs_unenqueued_idx;
CREATE INDEX jobs_unenqueued_idx ON jobs (priority, created_at)
    WHERE enqueued_at IS NULL AND status IN ('queued', 'retrying');
UPDATE jobs SET enqueued_at = NULL WHERE parked_at IS NOT NULL;
DROP INDEX jobs_parked_idx;
ALTER TABLE jobs DROP COLUMN parked_at;
