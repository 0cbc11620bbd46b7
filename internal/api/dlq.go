package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// DeadLetterView is one entry of GET /v1/dlq.
type DeadLetterView struct {
	ID int64 `json:"id"`
	// Tenant is the dead letter's tenant (an admin lists several with
	// ?tenant=*).
	Tenant        string          `json:"tenant"`
	JobID         string          `json:"job_id,omitempty"`
	Lane          string          `json:"lane"`
	Reason        string          `json:"reason"`
	Attempts      int             `json:"attempts"`
	LastError     string          `json:"last_error,omitempty"`
	FirstFailedAt time.Time       `json:"first_failed_at"`
	LastFailedAt  time.Time       `json:"last_failed_at"`
	CreatedAt     time.Time       `json:"created_at"`
	Body          json.RawMessage `json:"body,omitempty"`        // the original message when it is JSON
	BodyBase64    []byte          `json:"body_base64,omitempty"` // else its bytes
}

// DLQResponse is the body of GET /v1/dlq.
type DLQResponse struct {
	DeadLetters []DeadLetterView `json:"dead_letters"`
	NextCursor  string           `json:"next_cursor,omitempty"`
}

// ReplayResponse is the body of POST /v1/dlq/{id}/replay.
type ReplayResponse struct {
	ID     int64      `json:"id"`
	JobID  string     `json:"job_id,omitempty"`
	Status job.Status `json:"status"`
	// existing: the replay found its job stored already (a submission's
	// idempotency), answered 200 rather than 202.
	existing bool
}

func deadLetterView(dl store.DeadLetterRow) DeadLetterView {
	v := DeadLetterView{
		ID: dl.ID, Tenant: dl.Tenant, JobID: dl.JobID, Lane: string(dl.Lane), Reason: dl.Reason, Attempts: dl.Attempts,
		LastError: dl.LastError, FirstFailedAt: dl.FirstFailedAt, LastFailedAt: dl.LastFailedAt, CreatedAt: dl.CreatedAt,
	}
	if json.Valid(dl.Body) {
		v.Body = json.RawMessage(dl.Body)
	} else {
		v.BodyBase64 = dl.Body
	}
	return v
}

func (s *Server) handleDLQList(w http.ResponseWriter, r *http.Request, tenant string) {
	f, e := deadLetterFilter(r, tenant)
	if e == nil {
		f.Limit, e = parseLimit(r)
	}
	if e != nil {
		writeError(w, e)
		return
	}
	rows, next, err := s.store.FindDeadLetters(r.Context(), f)
	if err != nil {
		if errors.Is(err, store.ErrBadCursor) {
			writeError(w, badQuery("cursor", "cursor is not one this API returned"))
			return
		}
		writeError(w, s.storeError("list dead letters", job.Key{Tenant: tenant}, err))
		return
	}
	resp := DLQResponse{DeadLetters: make([]DeadLetterView, 0, len(rows)), NextCursor: next}
	for _, row := range rows {
		resp.DeadLetters = append(resp.DeadLetters, deadLetterView(row))
	}
	writeJSON(w, http.StatusOK, resp)
}

var errDeadLetterNotFound = apiError(http.StatusNotFound, CodeNotFound, "no such dead letter")

// handleDLQReplay replays a dead letter. A job's dead letter moves the job
// back to queued in one transaction that also removes the dead letter
// (store.ReplayDeadLetter), then its message is published: 202 means the
// job is durable and will run, since a publish that does not follow (a
// broker outage, a crash) is the reconciler's to make. A job that failed
// at intake is re-read from its dead letter's body, as the ingester would
// read it now (a model added to models: since makes it valid); a body still
// invalid is a 409 naming why. A message's dead letter (no job holds it)
// is re-published to the intake, then removed.
func (s *Server) handleDLQReplay(w http.ResponseWriter, r *http.Request, tenant string) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, errDeadLetterNotFound)
		return
	}
	ctx := r.Context()
	dl, err := s.store.GetDeadLetter(ctx, tenant, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			writeError(w, errDeadLetterNotFound)
			return
		}
		writeError(w, s.storeError("get dead letter", job.Key{Tenant: tenant}, err))
		return
	}
	resp, e := s.replay(ctx, dl)
	if e != nil {
		writeError(w, e)
		return
	}
	status := http.StatusAccepted
	if resp.existing {
		status = http.StatusOK
	}
	writeJSON(w, status, resp)
}

// replay replays the dead letter dl of its tenant (handleDLQReplay says how).
func (s *Server) replay(ctx context.Context, dl store.DeadLetterRow) (ReplayResponse, *errorResponse) {
	tenant, id := dl.Tenant, dl.ID
	if dl.Kind == store.DeadLetterMessage || dl.JobID == "" {
		return s.replayMessage(ctx, tenant, dl)
	}
	key := job.Key{Tenant: tenant, ID: dl.JobID}
	replacement, e := s.intakeReplacement(ctx, key, dl)
	if e != nil {
		return ReplayResponse{}, e
	}
	res, err := s.store.ReplayDeadLetter(ctx, tenant, id, replacement)
	var te *job.TransitionError
	switch {
	case errors.Is(err, store.ErrNotFound):
		return ReplayResponse{}, errDeadLetterNotFound
	case errors.As(err, &te):
		return ReplayResponse{}, apiError(http.StatusConflict, CodeConflict, fmt.Sprintf("the job is %s; only a dead or failed job can be replayed", te.From))
	case err != nil:
		return ReplayResponse{}, s.storeError("replay dead letter", key, err)
	}
	if res.Job == nil {
		return s.replayMessage(ctx, tenant, res.DeadLetter)
	}
	if s.failpoint != nil {
		s.failpoint(FailpointReplayAfterCommit)
	}
	rec := res.Job
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.publishTimeout)
	err = s.pub.Publish(pctx, rec.Priority, broker.WakeUp(key, rec.Model))
	cancel()
	if err == nil {
		err = s.store.MarkEnqueued(context.WithoutCancel(ctx), []job.Key{key})
	}
	if err != nil {
		s.log.Warn("replay dead letter: publish; the reconciler will", "tenant", tenant, "job_id", key.ID, "error", err)
	}
	return ReplayResponse{ID: id, JobID: dl.JobID, Status: rec.Status}, nil
}

// intakeReplacement re-reads the body of a job that failed at intake (its
// row holds a placeholder): nil for any other job.
func (s *Server) intakeReplacement(ctx context.Context, key job.Key, dl store.DeadLetterRow) (*job.Job, *errorResponse) {
	rec, err := s.store.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil // ReplayDeadLetter answers it
	}
	if err != nil {
		return nil, s.storeError("get job", key, err)
	}
	if rec.Status != job.StatusFailed || rec.StartedAt != nil || len(rec.Errors) == 0 || rec.Errors[0].Kind != "invalid" {
		return nil, nil
	}
	j, err := job.ParseQueued(dl.Body, job.Priority(dl.Lane), s.limits)
	// A body that names no tenant reads as the default one; the dead
	// letter's tenant is the job's.
	if err == nil && (j.ID != key.ID || j.Tenant != key.Tenant && j.Tenant != job.DefaultTenant) {
		err = &job.ValidationError{Field: "id", Rule: "does not name this job"}
	}
	j.Tenant = key.Tenant
	if err == nil {
		err = s.checkModels(&j)
	}
	if err == nil {
		// Its destinations are the tenant's to use: a reply queue of its
		// own, a webhook host and a result topic it is allowed.
		err = j.ValidateDestinations()
	}
	if err == nil {
		err = s.dests.Check(j)
	}
	if err != nil {
		return nil, apiError(http.StatusConflict, CodeConflict, "the dead letter is still not a valid job: "+err.Error())
	}
	return &j, nil
}

// replayMessage re-publishes a message's dead letter to the intake, then
// removes it; a crash in between replays it twice, which the ingester
// recognises as the same message.
//
// The message goes out under llmq's own broker identity, which vouches
// for no tenant: the ingester would take the tenant its body names (none
// is the default one). A body whose tenant is not the dead letter's is
// refused here, or a tenant's key could file a job, or the body itself,
// under another tenant (a message the identity rule refused names one by
// definition).
func (s *Server) replayMessage(ctx context.Context, tenant string, dl store.DeadLetterRow) (ReplayResponse, *errorResponse) {
	lane := job.Priority(dl.Lane)
	if !lane.Valid() {
		lane = job.PriorityNormal
	}
	msg := broker.Message{Key: dl.JobID, Body: dl.Body}
	named := bodyTenant(dl.Body)
	if s.brokerTenants[tenant] {
		if broker.RefusedByIdentity(dl.Reason) && (named == "" || named == tenant) {
			// Filed here because no broker user of the tenant's vouched
			// for it (under the default tenant when that one has broker
			// users): replayed under any identity, it would become the
			// tenant's job on nobody's word.
			return ReplayResponse{}, apiError(http.StatusConflict, CodeConflict, fmt.Sprintf(
				"no broker user of tenant %q vouched for this message, and tenant %q takes raw publishes only from them; "+
					"publish the message again with one of them", tenant, tenant))
		}
		// The tenant takes raw publishes only from its broker users: sent
		// under llmq's identity, the message would be refused again and
		// filed under the default tenant. A broker whose tenant intake
		// vouches for the tenant (Kafka's own topics) carries it, and then
		// a body may name no tenant, as its publisher's did; over one that
		// cannot (RabbitMQ), the job is submitted as the API submits one.
		v, ok := s.pub.(interface{ VouchesIntakeTenant() bool })
		if !ok || !v.VouchesIntakeTenant() {
			return s.replayAsSubmission(ctx, tenant, dl, lane, named)
		}
		msg.IntakeTenant = tenant
		if named == "" {
			named = tenant
		}
	}
	if named == "" {
		named = job.DefaultTenant
	}
	if named != tenant {
		return ReplayResponse{}, apiError(http.StatusConflict, CodeConflict, fmt.Sprintf(
			"the message names tenant %q (a body naming none, or not a job object, reads as %q), not the dead letter's tenant %q: "+
				"replayed, it would be filed under %q; publish it again as %q's", named, job.DefaultTenant, tenant, named, tenant))
	}
	pctx, cancel := context.WithTimeout(ctx, s.publishTimeout)
	err := s.pub.PublishIntake(pctx, lane, msg)
	cancel()
	if err != nil {
		s.log.Warn("replay dead letter: publish", "tenant", tenant, "dead_letter_id", dl.ID, "error", err)
		e := apiError(http.StatusServiceUnavailable, CodeBrokerUnavailable, "the broker did not confirm the replayed message; the dead letter is kept, retry later")
		e.RetryAfter = 5
		return ReplayResponse{}, e
	}
	s.removeReplayed(ctx, tenant, dl.ID)
	return ReplayResponse{ID: dl.ID, JobID: dl.JobID, Status: job.StatusQueued}, nil
}

// replayAsSubmission replays the message dead letter dl of a tenant that
// takes raw publishes only from its broker users, over a broker that
// cannot vouch for it. The dead letter is filed under the tenant because
// one of its broker users published the message (the ingester and the
// reconciler file a message no identity vouched for elsewhere, and a
// refusal of the identity rule, which replayMessage turns down, says so
// in its reason), so the API reads the body as the ingester would and
// submits the job under that tenant (POST /v1/jobs's checks, store and
// publish), then removes the dead letter. A body naming another tenant
// (named, bodyTenant's), not a valid job, or another job under a stored
// job's id stays where it is.
func (s *Server) replayAsSubmission(ctx context.Context, tenant string, dl store.DeadLetterRow, lane job.Priority, named string) (ReplayResponse, *errorResponse) {
	refuse := func(format string, args ...any) (ReplayResponse, *errorResponse) {
		return ReplayResponse{}, apiError(http.StatusConflict, CodeConflict, fmt.Sprintf(format, args...))
	}
	if named != "" && named != tenant {
		return refuse("the message names tenant %q, not the dead letter's tenant %q; publish it again as %q's", named, tenant, named)
	}
	invalid := func(why string) (ReplayResponse, *errorResponse) {
		return refuse("the dead letter is not a valid job (%s), and tenant %q takes raw publishes only from its broker users, "+
			"for which this broker cannot vouch on a replay; publish the message again with one of them", why, tenant)
	}
	// As the ingester reads a body its broker user published: the user's
	// tenant stands where the body names none.
	j, err := job.ParseIntake(dl.Body, lane, job.Properties{Tenant: tenant}, s.limits)
	if err != nil {
		return invalid(err.Error())
	}
	j, e := s.prepare(tenant, j)
	if e != nil {
		return invalid(e.Body.Message)
	}
	s.carryTrace(ctx, &j, false) // the job's spans join the replay's trace
	rec, created, e := s.submit(ctx, j)
	switch {
	case e != nil && e.Status == http.StatusBadRequest: // a value Postgres will not store
		return invalid(e.Body.Message)
	case e != nil:
		return ReplayResponse{}, e
	case !created && !job.Same(rec.Job, withProperties(j, rec.Job)):
		return refuse("job %q is stored with another body (the dead letter's reason: %s); the dead letter is kept", j.ID, dl.Reason)
	}
	s.removeReplayed(ctx, tenant, dl.ID)
	return ReplayResponse{ID: dl.ID, JobID: j.ID, Status: rec.Status, existing: !created}, nil
}

// withProperties is j with stored's reply_to and correlation_id where j's
// body gives none: a RabbitMQ message may carry either as an AMQP
// property, which the ingester takes for each the body leaves out and its
// dead letter does not keep, so the stored job of the same message can
// hold what the body does not.
func withProperties(j, stored job.Job) job.Job {
	j.ReplyTo = cmp.Or(j.ReplyTo, stored.ReplyTo)
	j.CorrelationID = cmp.Or(j.CorrelationID, stored.CorrelationID)
	return j
}

// removeReplayed removes the dead letter id of tenant once its message went
// out again. A failure is logged: the dead letter stays, and replaying it
// again finds its job there (a duplicate message, or an existing job).
func (s *Server) removeReplayed(ctx context.Context, tenant string, id int64) {
	if _, err := s.store.TakeDeadLetter(context.WithoutCancel(ctx), tenant, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Error("replay dead letter: remove", "tenant", tenant, "dead_letter_id", id, "error", err)
	}
}

// bodyTenant is the tenant an intake message's body names: its "tenant"
// string, or "" when it names none or is not a job object.
func bodyTenant(body []byte) string {
	var fields struct {
		Tenant *string `json:"tenant"`
	}
	if json.Unmarshal(body, &fields) != nil || fields.Tenant == nil {
		return ""
	}
	return *fields.Tenant
}
