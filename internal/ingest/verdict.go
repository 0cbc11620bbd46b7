package ingest

import (
	"bytes"
	"encoding/json"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// verdict is what the ingester makes of one intake message: a job to
// store, or a failure to record.
type verdict struct {
	job     job.Job              // valid: normalised and validated
	failure *store.IntakeFailure // set when the message is refused
}

// judge parses body as the queue contract says (job.ParseQueued: a message
// without a priority takes its lane's; a deadline already past is not
// refused, the job's claim ends it dead with "deadline passed").
func (in *Ingester) judge(lane job.Priority, msg broker.Message) verdict {
	tenant, refusal, fileUnder := in.identity.TenantOf(msg)
	if refusal != "" {
		// No id is read: a row under the claimed tenant would let a
		// publisher squat another tenant's job ids.
		return verdict{failure: &store.IntakeFailure{Tenant: fileUnder, Lane: lane, Reason: refusal, Body: msg.Body}}
	}
	props := job.Properties{ReplyTo: msg.ReplyTo, CorrelationID: msg.CorrelationID, Tenant: tenant}
	j, err := job.ParseIntake(msg.Body, lane, props, in.cfg.Limits)
	if err != nil {
		return in.refuse(lane, msg.Body, props, err.Error())
	}
	if reason := in.unknownModel(&j); reason != "" {
		return in.refuse(lane, msg.Body, props, reason)
	}
	// A destination the tenant may not use fails the job like an unknown
	// model: visible under its id, with the reason.
	if err := in.cfg.CheckDestination(j); err != nil {
		return in.refuse(lane, msg.Body, props, err.Error())
	}
	return verdict{job: j}
}

// unknownModel says why j's models cannot serve it (not configured, or
// not of its kind), or "".
func (in *Ingester) unknownModel(j *job.Job) string {
	if in.cfg.CheckModels == nil {
		return ""
	}
	if err := in.cfg.CheckModels(j); err != nil {
		return err.Error()
	}
	return ""
}

// refuse builds the failure of a message, reading what it can of its
// tenant, id and model so that the job is visible under its id. A tenant
// that is present but invalid leaves the id unread: the message cannot be
// placed under a tenant.
func (in *Ingester) refuse(lane job.Priority, body []byte, props job.Properties, reason string) verdict {
	f := &store.IntakeFailure{Tenant: job.DefaultTenant, Lane: lane, Reason: reason, Body: body}
	if props.Tenant != "" {
		// The broker identity's tenant; the body names it or none.
		f.Tenant = props.Tenant
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) == nil {
		str := func(name string) (string, bool) {
			var v string
			raw, ok := fields[name]
			return v, ok && json.Unmarshal(raw, &v) == nil
		}
		tenantOK := true
		if t, ok := str("tenant"); ok && t != "" {
			if job.ValidTenant(t) {
				f.Tenant = t
			} else {
				tenantOK = false
			}
		} else if _, present := fields["tenant"]; present && string(bytes.TrimSpace(fields["tenant"])) != "null" {
			tenantOK = false
		}
		if id, ok := str("id"); ok && tenantOK && job.ValidID(id) {
			f.ID = id
		}
		if m, ok := str("model"); ok && len(m) <= 128 {
			f.Model = m
		}
		if p, ok := str("priority"); ok && job.Priority(p).Valid() {
			f.Lane = job.Priority(p)
		}
		if r, ok := str("reply_to"); ok && r != "" {
			props.ReplyTo = r
		}
		if c, ok := str("correlation_id"); ok && c != "" {
			props.CorrelationID = c
		}
	}
	// The failed job's event still goes where the producer waits for it,
	// if that is a queue its tenant may name.
	if f.ID != "" && job.ValidReplyTo(f.Tenant, props.ReplyTo) {
		f.ReplyTo = props.ReplyTo
		if len(props.CorrelationID) <= 255 {
			f.CorrelationID = props.CorrelationID
		}
	}
	return verdict{failure: f}
}
