package retention

import (
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
)

// FromConfig is the sweeper's Config from llmq's configuration: the
// retention: section and each tenant's retention: overrides.
func FromConfig(c config.Config) Config {
	r := c.Retention
	out := Config{
		Jobs: Policy{job.StatusSucceeded: r.Succeeded, job.StatusFailed: r.Failed,
			job.StatusDead: r.Dead, job.StatusCancelled: r.Cancelled},
		Tenants:     map[string]Policy{},
		Idempotency: r.Idempotency, Usage: r.Usage,
		Interval: r.Interval, Batch: r.Batch, Pause: r.Pause,
	}
	for name, t := range c.Tenants {
		o := t.Retention
		if o == (config.TenantRetention{}) {
			continue
		}
		out.Tenants[name] = Policy{job.StatusSucceeded: o.Succeeded, job.StatusFailed: o.Failed,
			job.StatusDead: o.Dead, job.StatusCancelled: o.Cancelled}
	}
	return out
}
