// Package migrations holds llmq's versioned Postgres schema as SQL files,
// embedded in the binary and applied by pressly/goose v3 through
// store.Migrate. Files are named NNNNN_name.sql and carry goose's
// "-- +goose Up" and "-- +goose Down" sections; a released file is never
// edited, a change is a new file.
package migrations

import "embed"

// FS holds every migration file.
//
//go:embed *.sql
var FS embed.FS
