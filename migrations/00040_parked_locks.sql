-- +goose Up
-- A batch of parked jobs the unparker runs under a row lock
-- (store.LockParked, write-once in docs/design.md) leaves no trace in its
-- rows until it settles: a worker that dies meanwhile would spend no
-- attempt, and a job that kills its worker would run again for ever. Each
-- lock records its jobs here, outside its transaction, and its settle
-- deletes the record in it; a record whose transaction is gone (its
-- backend pid no longer in a transaction begun before the record) marks
-- its jobs as a lost attempt, as a lease that expired would.
CREATE TABLE parked_locks (
    id        bigserial PRIMARY KEY,
    owner     text NOT NULL,
    pid       integer NOT NULL,
    locked_at timestamptz NOT NULL DEFAULT now(),
    tenants   text[] NOT NULL,
    ids       text[] NOT NULL
);

-- +goose Down
DROP TABLE parked_locks;
