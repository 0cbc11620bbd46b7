package store

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/pglisten"
)

// CancelChannel is the notification a running job's cancellation sends
// (migrations/00024_cancel_notify.sql): "<tenant> <id>".
const CancelChannel = "llmq_job_cancelled"

// ListenCancels calls abort with the key of every running job cancelled
// from now on, until ctx ends. It holds one connection of its own (connect)
// in LISTEN and reconnects after a failure (internal/pglisten); a
// cancellation sent while it was not listening is not seen, and its call
// runs to its end, whose result the store then refuses.
func ListenCancels(ctx context.Context, connect func(ctx context.Context) (*pgx.Conn, error), abort func(job.Key), onErr func(error)) {
	pglisten.Loop{
		Connect: connect, Channel: CancelChannel, MaxBackoff: 5 * time.Second,
		OnPayload: func(payload string) {
			if tenant, id, ok := strings.Cut(payload, " "); ok {
				abort(job.Key{Tenant: tenant, ID: id})
			}
		},
		OnRetry: func(err error, _ time.Duration) {
			if onErr != nil {
				onErr(err)
			}
		},
	}.Run(ctx)
}
