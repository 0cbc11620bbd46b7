package config

import (
	"sort"
	"time"
)

// Retention is how long llmq keeps what it no longer needs
// (docs/design.md#retention). A finished job is deleted once its status's
// retention has passed since it finished, with its dead letter and webhook
// deliveries; its id stays known for Idempotency after that.
//
// The defaults keep failures longer than successes: a success's result has
// been delivered (reply, result topic, webhook, feed) and a week covers a
// client that polls late or a webhook receiver that was down over a long
// weekend; a failure or dead job is what an operator investigates or
// replays, which can take a release cycle, so it stays a month. To keep a
// status for ever in practice, set a very long duration (e.g. 876000h).
type Retention struct {
	// Succeeded, Failed, Dead and Cancelled are how long a job of each
	// finished status is kept after completed_at (defaults 168h, 720h,
	// 720h, 168h). Dead also bounds message dead letters (kind 'message').
	Succeeded time.Duration `yaml:"succeeded"`
	Failed    time.Duration `yaml:"failed"`
	Dead      time.Duration `yaml:"dead"`
	Cancelled time.Duration `yaml:"cancelled"`
	// Idempotency is how long a deleted job's (tenant, id) is still
	// answered as a duplicate instead of being run again (default 168h).
	Idempotency time.Duration `yaml:"idempotency"`
	// Usage is how long usage_hours rows are kept (default 9600h, 400 days:
	// a year's usage can be compared with the year before).
	Usage time.Duration `yaml:"usage"`
	// Interval is the sweep period (default 1m).
	Interval time.Duration `yaml:"interval"`
	// Batch is how many rows one DELETE removes (default 1000): small
	// enough that a batch holds its locks for milliseconds.
	Batch int `yaml:"batch"`
	// Pause is the rest between two batches (default 50ms), so that a large
	// backlog of expired rows is worked off without starving the hot path.
	Pause time.Duration `yaml:"pause"`
}

// TenantRetention overrides the retention of a tenant's finished jobs;
// zero keeps the global setting.
type TenantRetention struct {
	Succeeded time.Duration `yaml:"succeeded"`
	Failed    time.Duration `yaml:"failed"`
	Dead      time.Duration `yaml:"dead"`
	Cancelled time.Duration `yaml:"cancelled"`
}

// withDefaults fills the unset retention settings.
func (r *Retention) withDefaults() {
	const day = 24 * time.Hour
	for _, d := range []struct {
		p *time.Duration
		v time.Duration
	}{
		{&r.Succeeded, 7 * day}, {&r.Failed, 30 * day}, {&r.Dead, 30 * day}, {&r.Cancelled, 7 * day},
		{&r.Idempotency, 7 * day}, {&r.Usage, 400 * day}, {&r.Interval, time.Minute}, {&r.Pause, 50 * time.Millisecond},
	} {
		if *d.p == 0 {
			*d.p = d.v
		}
	}
	if r.Batch == 0 {
		r.Batch = 1000
	}
}

// validateRetention checks the global and per-tenant retention settings.
func (c Config) validateRetention() error {
	r := c.Retention
	for key, d := range map[string]time.Duration{"succeeded": r.Succeeded, "failed": r.Failed, "dead": r.Dead,
		"cancelled": r.Cancelled, "idempotency": r.Idempotency, "usage": r.Usage, "interval": r.Interval, "pause": r.Pause} {
		if d < 0 {
			return badKey("retention."+key, "must not be negative")
		}
	}
	if r.Batch < 1 {
		return badKey("retention.batch", "must be positive")
	}
	names := make([]string, 0, len(c.Tenants))
	for name := range c.Tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t := c.Tenants[name].Retention
		for key, d := range map[string]time.Duration{"succeeded": t.Succeeded, "failed": t.Failed, "dead": t.Dead, "cancelled": t.Cancelled} {
			if d < 0 {
				return badKey("tenants."+name+".retention."+key, "must not be negative")
			}
		}
	}
	return nil
}
