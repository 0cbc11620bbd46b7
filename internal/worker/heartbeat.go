package worker

import (
	"context"
	"time"

	"github.com/llmq/llmq/internal/job"
)

// heartbeat extends the leases of every running job this worker holds,
// every Lease/3, until ctx ends.
func (w *Worker) heartbeat(ctx context.Context) {
	every := w.cfg.Lease / 3
	if every <= 0 {
		every = time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		w.mu.Lock()
		keys := make([]job.Key, 0, len(w.inflight))
		for k := range w.inflight {
			keys = append(keys, k)
		}
		w.mu.Unlock()
		if len(keys) == 0 {
			continue
		}
		n, err := w.store.Heartbeat(ctx, w.cfg.Owner, keys, w.cfg.Lease)
		if err != nil {
			if ctx.Err() == nil {
				w.log.Error("heartbeat", "leases", len(keys), "error", err)
			}
			continue
		}
		w.metrics.heartbeats.Add(float64(n))
		if n < len(keys) {
			w.log.Debug("heartbeat extended fewer leases than held", "held", len(keys), "extended", n)
		}
	}
}
