package store

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// CancelChannel is the notification a running job's cancellation sends
// (migrations/00024_cancel_notify.sql): "<tenant> <id>".
const CancelChannel = "llmq_job_cancelled"

// ListenCancels calls abort with the key of every running job cancelled
// from now on, until ctx ends. It holds one connection of its own (connect)
// in LISTEN and reconnects after a failure, waiting between tries from
// 100 ms up to 5 s; a cancellation sent while it was not listening is not
// seen, and its call runs to its end, whose result the store then refuses.
func ListenCancels(ctx context.Context, connect func(ctx context.Context) (*pgx.Conn, error), abort func(job.Key), onErr func(error)) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := listenCancels(ctx, connect, abort)
		if ctx.Err() != nil {
			return
		}
		if onErr != nil {
			onErr(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func listenCancels(ctx context.Context, connect func(ctx context.Context) (*pgx.Conn, error), abort func(job.Key)) error {
	conn, err := connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := conn.Exec(ctx, "LISTEN "+CancelChannel); err != nil {
		return err
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		tenant, id, ok := strings.Cut(n.Payload, " ")
		if ok {
			abort(job.Key{Tenant: tenant, ID: id})
		}
	}
}
