package worker

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is one readiness probe (Postgres ping, broker reachability).
type Check struct {
	Name  string
	Check func(ctx context.Context) error
}

// Handler serves /metrics from gatherer, /healthz (the process is alive)
// and /readyz (every check passes within 2s).
func Handler(gatherer prometheus.Gatherer, checks ...Check) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for _, c := range checks {
			if err := c.Check(ctx); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "%s: not ready\n", c.Name)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}
