-- +goose Up
-- A job's request and response are most of its row, and Postgres
-- compresses a row's largest values once it passes ~2 KB: the completion
-- that stores a response of a few KB compresses it. lz4 does that in
-- about half the time pglz takes (8 of ~21 µs a row for a 1.6 KB answer,
-- same table size; BENCHMARKS.md). Only values written from now on use it.
-- A server built without lz4, or older than 14 (no per-column compression),
-- keeps pglz.
-- +goose StatementBegin
DO $$
BEGIN
    ALTER TABLE jobs ALTER COLUMN request SET COMPRESSION lz4, ALTER COLUMN response SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE NOTICE 'no lz4 compression on this server: jobs keep pglz';
END $$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE jobs ALTER COLUMN request SET COMPRESSION default, ALTER COLUMN response SET COMPRESSION default;
