package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
)

// maxWait bounds ?wait= on GET /v1/jobs/{id}.
const maxWait = 60 * time.Second

// waitWriteSlack is how long a long-poll may take to answer beyond its
// wait: the http.Server's WriteTimeout counts from the request, and a
// wait of maxWait must not run into it.
const waitWriteSlack = 30 * time.Second

// HeaderWaited, on an answer to GET /v1/jobs/{id}?wait=, is how long the
// request waited for the job to finish, in seconds; its presence tells a
// client the server long-polls.
const HeaderWaited = "X-Llmq-Waited"

// parseWait reads ?wait=: a Go duration ("30s", "1500ms") or whole
// seconds ("30"), 0..maxWait.
func parseWait(r *http.Request) (time.Duration, *errorResponse) {
	raw := r.URL.Query().Get("wait")
	if raw == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(raw)
	if err != nil {
		n, errN := strconv.Atoi(raw)
		d, err = time.Duration(n)*time.Second, errN
	}
	if err != nil || d < 0 || d > maxWait {
		return 0, badQuery("wait", fmt.Sprintf("wait must be a duration between 0s and %s (e.g. 30s)", maxWait))
	}
	return d, nil
}

// handleGet answers GET /v1/jobs/{id}; with ?wait= it answers as soon as
// the job is terminal, or when the wait is over with the job as it is.
// The waiter is registered before the row is read, so a finish committed
// in between still wakes it; a wake costs one read of the row, and
// nothing else runs per waiting request.
func (s *Server) handleGet(w http.ResponseWriter, r *http.Request, tenant string) {
	key := job.Key{Tenant: tenant, ID: r.PathValue("id")}
	if !job.ValidID(key.ID) {
		writeError(w, errNotFound)
		return
	}
	wait, e := parseWait(r)
	if e != nil {
		writeError(w, e)
		return
	}
	ctx := r.Context()
	if wait == 0 || s.finished == nil {
		rec, err := s.store.Get(ctx, key)
		if err != nil {
			writeError(w, s.storeError("get job", key, err))
			return
		}
		s.writeJob(ctx, w, rec)
		return
	}

	waiter := s.finished.Register(key)
	defer waiter.Stop()
	rec, err := s.store.Get(ctx, key)
	if err != nil {
		writeError(w, s.storeError("get job", key, err))
		return
	}
	start := time.Now()
	if !rec.Status.Terminal() {
		_ = http.NewResponseController(w).SetWriteDeadline(start.Add(wait + waitWriteSlack)) // not every writer can; the default timeout stands
		s.metrics.longPolls.Inc()
		rec, err = s.await(ctx, key, waiter.C, wait, rec)
		s.metrics.longPolls.Dec()
		if ctx.Err() != nil {
			return // the client is gone
		}
		if err != nil {
			writeError(w, s.storeError("get job", key, err))
			return
		}
	}
	w.Header().Set(HeaderWaited, strconv.FormatFloat(time.Since(start).Seconds(), 'f', 3, 64))
	s.writeJob(ctx, w, rec)
}

// await re-reads the job on every wake until it is terminal, the wait is
// over or the server drains (then it reads once more), or ctx ends.
func (s *Server) await(ctx context.Context, key job.Key, wake <-chan struct{}, wait time.Duration, rec store.Record) (store.Record, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return rec, ctx.Err()
		case <-timer.C:
			return s.store.Get(ctx, key)
		case <-s.draining:
			return s.store.Get(ctx, key)
		case <-wake:
			next, err := s.store.Get(ctx, key)
			if err != nil || next.Status.Terminal() {
				return next, err
			}
			rec = next
		}
	}
}

// writeJob answers 200 with rec's document, with its expected start when
// it is queued, its latest webhook delivery when it has one, and its
// attempt log.
func (s *Server) writeJob(ctx context.Context, w http.ResponseWriter, rec store.Record) {
	doc := s.viewsOf(ctx, []store.Record{rec})[0]
	doc.ExpectedStartAt = s.expectedStart(ctx, rec)
	doc.AttemptLog = s.attemptLog(ctx, rec)
	writeJSON(w, http.StatusOK, doc)
}

// attemptLog is the job's timeline. The job is still worth showing
// without it: a failed read is logged and answered as no attempts.
func (s *Server) attemptLog(ctx context.Context, rec store.Record) *[]results.Attempt {
	log, err := s.store.AttemptLog(ctx, rec.Key())
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("read attempt log", "tenant", rec.Tenant, "job_id", rec.ID, "error", err)
	}
	out := results.AttemptsOf(rec.CreatedAt, log)
	return &out
}

// expectedStart is when a queued job should start: the jobs waiting ahead
// of it in its lane over the lane's drain rate, from now. Nil for a job
// that is not queued, while the lane drains nothing, or when the count
// fails (the document is still worth answering).
func (s *Server) expectedStart(ctx context.Context, rec store.Record) *time.Time {
	if rec.Status != job.StatusQueued || s.finished == nil {
		return nil
	}
	rate := s.finished.DrainRate(rec.Priority)
	if rate <= 0 {
		return nil
	}
	ahead, err := s.store.Ahead(ctx, rec.Priority, rec.CreatedAt, rec.ID)
	if err != nil {
		s.log.Warn("count jobs ahead", "tenant", rec.Tenant, "job_id", rec.ID, "error", err)
		return nil
	}
	at := s.now().Add(time.Duration(float64(ahead) / rate * float64(time.Second))).UTC()
	return &at
}
