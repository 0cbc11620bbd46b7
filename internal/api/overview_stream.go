package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// overviewEvery is how often GET /v1/overview/stream sends the document.
const overviewEvery = time.Second

// statusFor is what GET /v1/status answers r: an admin without ?tenant=
// gets the global document with every tenant's; anyone else the acting
// tenant's view (roles.go).
func (s *Server) statusFor(r *http.Request, tenant string) Status {
	if principalOf(r).Admin && r.URL.Query().Get(tenantParam) == "" {
		return s.mon.adminView()
	}
	return s.mon.tenantView(tenant)
}

// overviewFor is the overview r may see: the models only for an admin.
func (s *Server) overviewFor(r *http.Request, tenant string) Overview {
	o := Overview{Status: s.statusFor(r, tenant), Models: []ModelOverview{}, UpdatedAt: s.now().UTC()}
	if principalOf(r).Admin {
		o.Models = s.hub.snapshot()
	}
	return o
}

// handleOverview answers GET /v1/overview: the overview once.
func (s *Server) handleOverview(w http.ResponseWriter, r *http.Request, tenant string) {
	writeJSON(w, http.StatusOK, s.overviewFor(r, tenant))
}

// handleOverviewStream answers GET /v1/overview/stream: the overview as
// server-sent events ("event: overview"), one at once and one every
// second, until the viewer leaves or the server drains. Each write moves
// the connection's write deadline on, so the stream outlives the
// server's WriteTimeout.
func (s *Server) handleOverviewStream(w http.ResponseWriter, r *http.Request, tenant string) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no") // a proxy in front must not buffer the stream
	w.WriteHeader(http.StatusOK)
	t := time.NewTicker(overviewEvery)
	defer t.Stop()
	for {
		body, err := json.Marshal(s.overviewFor(r, tenant))
		if err != nil {
			s.log.Error("encode overview", "error", err)
			return
		}
		_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := fmt.Fprintf(w, "event: overview\ndata: %s\n\n", body); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-s.draining:
			return
		case <-t.C:
		}
	}
}
