-- +goose Up
-- A result event the broker refuses on its own (a full reply queue that
-- nacks, an event over Kafka's message size, a result topic that cannot
-- be made) used to fail its whole relay round, and the next round took it
-- first again: every later event of every tenant waited behind it. Such
-- an event is now put off (store.RelayResults) with a backoff, and the
-- round takes only events that are due. Adding the columns with a constant
-- default rewrites nothing.
ALTER TABLE result_events
    ADD COLUMN attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN next_attempt_at timestamptz;

-- +goose Down
ALTER TABLE result_events DROP COLUMN attempts, DROP COLUMN next_attempt_at;
