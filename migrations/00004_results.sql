-- +goose Up
-- Results flow back (docs/design.md#results). Every terminal transition of a
-- job row, by whatever statement makes it, leaves in the same transaction:
--   * an outbox row in result_events, naming the finished job, that
--     the result relay publishes (llmq.results, reply_to, result topic) and
--     turns into webhook deliveries, then deletes;
--   * jobs.finished_xid, the transaction that finished the job, which orders
--     the incremental feed GET /v1/jobs?finished_after=.
-- Triggers, not the store's statements, do this so that no path to a
-- terminal status (the worker, cancel, the ingester's verdicts, the
-- reconciler, raw SQL) can finish a job silently.
--
-- The relay, not these triggers, sends NOTIFY llmq_job_finished (for
-- long-polls) when it publishes: a NOTIFY makes its transaction hold a
-- database-wide lock through its commit, which serialised the workers'
-- commits and cut the pipeline's throughput tenfold (BENCHMARKS.md).

-- Where a job's result goes besides Postgres; validated at submit and at
-- intake (internal/job, internal/results).
ALTER TABLE jobs ADD COLUMN reply_to       text;
ALTER TABLE jobs ADD COLUMN correlation_id text;
ALTER TABLE jobs ADD COLUMN callback_url   text;
ALTER TABLE jobs ADD COLUMN result_topic   text;
ALTER TABLE jobs ADD COLUMN finished_xid   xid8;

-- The feed reads a tenant's finished jobs in (finished_xid, id) order, and
-- only below the oldest transaction still running, so a job that commits
-- late can never land behind a cursor already handed out.
CREATE INDEX jobs_finished_idx ON jobs (tenant, finished_xid, id) WHERE finished_xid IS NOT NULL;

CREATE TABLE result_events (
    seq         bigserial   PRIMARY KEY,
    -- the event's identity for readers that dedupe: the same on every
    -- publish of this row
    event_id    uuid        NOT NULL DEFAULT gen_random_uuid(),
    tenant      text        NOT NULL,
    job_id      text        NOT NULL,
    status      text        NOT NULL,
    occurred_at timestamptz NOT NULL,
    CONSTRAINT result_events_status_terminal CHECK (status IN ('succeeded', 'failed', 'dead', 'cancelled'))
);
-- The event's data is read from the job row when the relay publishes, not
-- copied here: a copy of every response cost the hot path a third of its
-- throughput (BENCHMARKS.md). A job replayed and running again before the
-- relay got to its event (milliseconds) is published with the event's
-- status and time and the row's other fields as they are then.

-- Webhook deliveries: one per (event, endpoint), written by the relay in
-- the transaction that deletes the event's outbox row, sent by the webhook
-- dispatcher (internal/webhook) with durable retries.
CREATE TABLE webhook_deliveries (
    id              bigserial   PRIMARY KEY,
    event_id        uuid        NOT NULL,
    tenant          text        NOT NULL,
    job_id          text        NOT NULL,
    url             text        NOT NULL,
    -- the exact bytes signed and sent on every attempt
    payload         bytea       NOT NULL,
    status          text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    last_error      text,
    last_status     integer,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    CONSTRAINT webhook_deliveries_status_valid CHECK (status IN ('pending', 'delivered', 'dead')),
    CONSTRAINT webhook_deliveries_pending CHECK ((status = 'pending') = (next_attempt_at IS NOT NULL)),
    CONSTRAINT webhook_deliveries_delivered CHECK ((status = 'delivered') = (delivered_at IS NOT NULL))
);
CREATE UNIQUE INDEX webhook_deliveries_event_url_idx ON webhook_deliveries (event_id, url);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_job_idx ON webhook_deliveries (tenant, job_id, id);

-- +goose StatementBegin
CREATE FUNCTION llmq_job_finished_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled') THEN
        IF TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status THEN
            NEW.finished_xid := pg_current_xact_id();
        END IF;
    ELSE
        NEW.finished_xid := NULL;
    END IF;
    RETURN NEW;
END $$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION llmq_job_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO result_events (tenant, job_id, status, occurred_at)
    VALUES (NEW.tenant, NEW.id, NEW.status, NEW.completed_at);
    RETURN NULL;
END $$;
-- +goose StatementEnd

-- WHEN keeps the function from being called for the many moves that
-- neither finish a job nor leave a finished one (claims, retries).
CREATE TRIGGER jobs_finished_xid_insert BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled'))
    EXECUTE FUNCTION llmq_job_finished_xid();
CREATE TRIGGER jobs_finished_xid_update BEFORE UPDATE OF status ON jobs
    FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled') OR OLD.finished_xid IS NOT NULL)
    EXECUTE FUNCTION llmq_job_finished_xid();
-- AFTER INSERT fires only for rows actually inserted (not for an
-- ON CONFLICT DO NOTHING that skipped), so a repeated submit emits nothing.
CREATE TRIGGER jobs_finished_insert AFTER INSERT ON jobs
    FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled'))
    EXECUTE FUNCTION llmq_job_finished();
CREATE TRIGGER jobs_finished_update AFTER UPDATE OF status ON jobs
    FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION llmq_job_finished();

-- +goose Down
DROP TRIGGER jobs_finished_update ON jobs;
DROP TRIGGER jobs_finished_insert ON jobs;
DROP TRIGGER jobs_finished_xid_update ON jobs;
DROP TRIGGER jobs_finished_xid_insert ON jobs;
DROP FUNCTION llmq_job_finished();
DROP FUNCTION llmq_job_finished_xid();
DROP TABLE webhook_deliveries;
DROP TABLE result_events;
DROP INDEX jobs_finished_idx;
ALTER TABLE jobs DROP COLUMN finished_xid;
ALTER TABLE jobs DROP COLUMN result_topic;
ALTER TABLE jobs DROP COLUMN callback_url;
ALTER TABLE jobs DROP COLUMN correlation_id;
ALTER TABLE jobs DROP COLUMN reply_to;
