package config

import (
	"sort"

	"github.com/llmq/llmq/internal/job"
)

// Job is the job package's view of the limits, as the API, the ingester,
// the worker and producer submit judge a job by them.
func (l Limits) Job() job.Limits {
	out := job.Limits{MaxPayloadBytes: l.MaxPayloadBytes, MaxOutputTokens: l.MaxOutputTokens}
	if len(l.RequestFields) > 0 {
		out.RequestFields = make(map[string]job.FieldRule, len(l.RequestFields))
		for name, r := range l.RequestFields {
			out.RequestFields[name] = job.FieldRule{Action: r.Action, Max: r.Max}
		}
	}
	return out
}

// validateRequestFields checks each limits.request_fields rule.
func (l Limits) validateRequestFields() error {
	names := make([]string, 0, len(l.RequestFields))
	for name := range l.RequestFields {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		r := l.RequestFields[name]
		if err := (job.FieldRule{Action: r.Action, Max: r.Max}).Validate(); err != nil {
			return badKey("limits.request_fields."+name, "%v", err)
		}
	}
	return nil
}
