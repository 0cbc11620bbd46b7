package api

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// SubmitResponse is the body of a successful POST /v1/jobs.
type SubmitResponse struct {
	ID     string     `json:"id"`
	Status job.Status `json:"status"`
}

// BatchItem is one entry of POST /v1/jobs:batch's "results", in request
// order: either ID and Status, or Error.
type BatchItem struct {
	Index      int        `json:"index"`
	HTTPStatus int        `json:"http_status"`
	ID         string     `json:"id,omitempty"`
	Status     job.Status `json:"status,omitempty"`
	Error      *ErrorBody `json:"error,omitempty"`
}

// BatchResponse is the body of POST /v1/jobs:batch.
type BatchResponse struct {
	Results  []BatchItem `json:"results"`
	Created  int         `json:"created"`
	Existing int         `json:"existing"`
	Rejected int         `json:"rejected"`
}

// newID generates a job ID for submissions that carry none: "j-" and 26
// base32 characters (130 random bits).
func newID() string { return "j-" + rand.Text() }

// readBody reads at most limit bytes; a larger body is a 413.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *errorResponse) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, apiError(http.StatusRequestEntityTooLarge, CodePayloadTooLarge, fmt.Sprintf("request body is over the %d byte limit", limit))
		}
		return nil, apiError(http.StatusBadRequest, CodeInvalidRequest, "could not read the request body")
	}
	return data, nil
}

// prepare turns a decoded job into what is stored: tenant from the key, an
// ID when none was given, defaults and validation, the normalized job
// within the payload limit.
func (s *Server) prepare(tenant string, j job.Job) (job.Job, *errorResponse) {
	if j.Tenant != "" && j.Tenant != tenant {
		return j, &errorResponse{Status: http.StatusBadRequest, Body: ErrorBody{
			Code: CodeInvalidJob, Field: "tenant",
			Message: "invalid job: tenant: is set by the API key; omit it or give the key's own tenant",
		}}
	}
	j.Tenant = tenant
	if j.ID == "" {
		j.ID = newID()
	}
	j.Normalize()
	if err := j.Validate(s.now(), s.limits); err != nil {
		return j, validationError(err)
	}
	if err := s.checkModels(&j); err != nil {
		return j, validationError(err)
	}
	if err := s.dests.Check(j); err != nil {
		return j, validationError(err)
	}
	body, err := json.Marshal(j)
	if err != nil {
		return j, validationError(&job.ValidationError{Rule: "cannot be encoded: " + err.Error()})
	}
	if len(body) > s.limits.MaxPayloadBytes {
		return j, &errorResponse{Status: http.StatusRequestEntityTooLarge, Body: ErrorBody{
			Code: CodePayloadTooLarge, Message: fmt.Sprintf("the normalized job is %d bytes, over the %d byte limit", len(body), s.limits.MaxPayloadBytes),
		}}
	}
	return j, nil
}

// checkModels refuses a job naming a model that models: does not list,
// when it lists any, or one that does not serve the job's kind: the
// consumer would only dead-letter it.
func (s *Server) checkModels(j *job.Job) error { return config.CheckJobModels(s.models, j) }

// submit stores and publishes one prepared job (group-committed with the
// submissions running at the same time). created is false for a
// re-submission of an existing (tenant, id), whose record is returned.
func (s *Server) submit(ctx context.Context, j job.Job) (store.Record, bool, *errorResponse) {
	adm := s.mon.admit(j.Tenant, 1)
	if !adm.ok {
		// Idempotency wins over back-pressure: a re-submission of a job we
		// already hold is answered, not refused (and pinned, so that the
		// submission that created it cannot take it back now).
		if rec, err := s.store.Resubmitted(ctx, j.Key()); err == nil {
			return rec, false, nil
		}
		s.metrics.submitted.WithLabelValues(resultBackpressure).Inc()
		return store.Record{}, false, adm.refusal()
	}
	res, err := s.commit.submit(j)
	rec, created, pubErr := res.Record, res.Created, res.Err
	if !created || err != nil || pubErr != nil {
		s.mon.release(j.Tenant, 1)
	} else {
		s.mon.storedJobs(j.Tenant, 1)
	}
	switch {
	case err == nil && pubErr == nil && created:
		s.metrics.submitted.WithLabelValues(resultCreated).Inc()
		return rec, true, nil
	case err == nil && pubErr == nil:
		s.metrics.submitted.WithLabelValues(resultExisting).Inc()
		return rec, false, nil
	case pubErr != nil && errors.Is(pubErr, broker.ErrRejected):
		// The broker's own lane limit (x-max-length) refused the message.
		s.metrics.submitted.WithLabelValues(resultBackpressure).Inc()
		st := s.mon.snapshot()
		return store.Record{}, false, backpressureError(st.Total, retryAfter(1, st.DrainRate).Seconds())
	case pubErr != nil:
		s.metrics.submitted.WithLabelValues(resultError).Inc()
		s.log.Warn("publish job", "tenant", j.Tenant, "job_id", j.ID, "lane", string(j.Priority), "error", pubErr)
		e := apiError(http.StatusServiceUnavailable, CodeBrokerUnavailable, "the broker did not confirm the job; nothing was stored, retry later with the same id")
		e.RetryAfter, e.ID = 5, j.ID
		return store.Record{}, false, e
	case store.Unstorable(err):
		// Postgres refused a value that passed validation (e.g. JSON nested
		// deeper than the server's stack allows): the job's fault, not an
		// outage.
		s.metrics.submitted.WithLabelValues(resultInvalid).Inc()
		return store.Record{}, false, validationError(&job.ValidationError{Rule: "Postgres cannot store a value of this job (" + pgMessage(err) + ")"})
	default:
		s.metrics.submitted.WithLabelValues(resultError).Inc()
		s.log.Error("store job", "tenant", j.Tenant, "job_id", j.ID, "error", err)
		e := apiError(http.StatusServiceUnavailable, CodeStoreUnavailable, "the job may not have been stored; retry later with the same id (a job id is processed once)")
		e.RetryAfter, e.ID = 5, j.ID
		return store.Record{}, false, e
	}
}

func pgMessage(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Message
	}
	return ""
}

func backpressureError(backlog int64, retryAfterSeconds float64) *errorResponse {
	e := apiError(http.StatusTooManyRequests, CodeBackpressure, "the backlog is over its hard limit; retry after the Retry-After delay")
	e.RetryAfter = int(math.Ceil(retryAfterSeconds))
	e.Backlog = backlog
	return e
}

func (s *Server) handleSubmit(w http.ResponseWriter, r *http.Request, tenant string) {
	data, e := readBody(w, r, s.maxBody)
	if e != nil {
		writeError(w, e)
		return
	}
	j, err := job.Decode(data, s.limits)
	if err != nil {
		s.metrics.submitted.WithLabelValues(resultInvalid).Inc()
		writeError(w, validationError(err))
		return
	}
	j, e = s.prepare(submitTenant(r, tenant, j), j)
	if e != nil {
		s.metrics.submitted.WithLabelValues(resultInvalid).Inc()
		writeError(w, e)
		return
	}
	s.carryTrace(r.Context(), &j, true)
	rec, created, e := s.submit(r.Context(), j)
	if e != nil {
		writeError(w, e)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusAccepted
	}
	writeJSON(w, status, SubmitResponse{ID: rec.ID, Status: rec.Status})
}

// batchConcurrency bounds the items of one batch in flight at once.
const batchConcurrency = 256

func (s *Server) handleSubmitBatch(w http.ResponseWriter, r *http.Request, tenant string) {
	data, e := readBody(w, r, s.maxBatchBody)
	if e != nil {
		writeError(w, e)
		return
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(data, &raws); err != nil {
		writeError(w, apiError(http.StatusBadRequest, CodeInvalidRequest, "the body must be a JSON array of jobs"))
		return
	}
	if len(raws) == 0 {
		writeError(w, apiError(http.StatusBadRequest, CodeInvalidRequest, "the batch is empty"))
		return
	}
	if len(raws) > s.maxBatchItems {
		writeError(w, apiError(http.StatusRequestEntityTooLarge, CodePayloadTooLarge, fmt.Sprintf("the batch has %d jobs, over the limit of %d", len(raws), s.maxBatchItems)))
		return
	}
	results := make([]BatchItem, len(raws))
	fail := func(i int, e *errorResponse) {
		body := e.Body
		results[i] = BatchItem{Index: i, HTTPStatus: e.Status, Error: &body}
	}
	type work struct {
		i int
		j job.Job
	}
	var todo []work
	seen := make(map[job.Key]int, len(raws))
	for i, raw := range raws {
		j, err := job.Decode(raw, s.limits)
		if err != nil {
			s.metrics.submitted.WithLabelValues(resultInvalid).Inc()
			fail(i, validationError(err))
			continue
		}
		j, e := s.prepare(submitTenant(r, tenant, j), j)
		if e != nil {
			s.metrics.submitted.WithLabelValues(resultInvalid).Inc()
			fail(i, e)
			continue
		}
		if first, dup := seen[j.Key()]; dup {
			fail(i, apiError(http.StatusBadRequest, CodeInvalidJob, fmt.Sprintf("invalid job: id: repeats the id of item %d", first)))
			results[i].Error.Field = "id"
			continue
		}
		seen[j.Key()] = i
		s.carryTrace(r.Context(), &j, false)
		todo = append(todo, work{i: i, j: j})
	}
	var (
		wg  sync.WaitGroup
		sem = make(chan struct{}, batchConcurrency)
		// refusedTenant is a tenant whose item back-pressure refused.
		refusedMu     sync.Mutex
		refusedTenant string
	)
	for _, t := range todo {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			rec, created, e := s.submit(r.Context(), t.j)
			if e != nil {
				fail(t.i, e)
				if e.Body.Code == CodeBackpressure {
					results[t.i].Error.Message += fmt.Sprintf(" (retry after %ds)", e.RetryAfter)
					refusedMu.Lock()
					refusedTenant = t.j.Tenant
					refusedMu.Unlock()
				}
				return
			}
			status := http.StatusOK
			if created {
				status = http.StatusAccepted
			}
			results[t.i] = BatchItem{Index: t.i, HTTPStatus: status, ID: rec.ID, Status: rec.Status}
		})
	}
	wg.Wait()
	resp := BatchResponse{Results: results}
	allBackpressure := true
	for _, it := range results {
		switch {
		case it.HTTPStatus == http.StatusAccepted:
			resp.Created++
		case it.HTTPStatus == http.StatusOK:
			resp.Existing++
		default:
			resp.Rejected++
		}
		if it.Error == nil || it.Error.Code != CodeBackpressure {
			allBackpressure = false
		}
	}
	if allBackpressure {
		// The whole batch's verdict: how long until there is room for all
		// of it (at least a second, should room have opened meanwhile).
		v := s.mon.verdict(refusedTenant, int64(len(results)))
		v.retryAfter = max(v.retryAfter, time.Second)
		refused := v.refusal()
		w.Header().Set("Retry-After", fmt.Sprint(refused.RetryAfter))
		writeJSON(w, http.StatusTooManyRequests, struct {
			Error   ErrorBody `json:"error"`
			Backlog int64     `json:"backlog"`
			BatchResponse
		}{Error: ErrorBody{Code: CodeBackpressure, Message: strings.TrimSuffix(refused.Body.Message, "; retry after the Retry-After delay") + "; no job of the batch was accepted"}, Backlog: refused.Backlog, BatchResponse: resp})
		return
	}
	writeJSON(w, http.StatusAccepted, resp)
}
