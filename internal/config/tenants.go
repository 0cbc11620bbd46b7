package config

import (
	"fmt"
	"sort"
)

// TenantLimits is what a tenant may take of the provider quota and of the
// backlog (docs/design.md#tenants). Zero means no limit of its own; the
// tenant still shares each model's quota by its weight.
type TenantLimits struct {
	// Weight is the tenant's share of each model's quota relative to the
	// other tenants that have work (default 1). Idle tenants' shares flow to
	// the busy ones.
	Weight float64 `yaml:"weight"`
	// RPM and TPM cap the tenant's calls and tokens per minute over every
	// model, across replicas.
	RPM float64 `yaml:"rpm"`
	TPM float64 `yaml:"tpm"`
	// DailyTokens caps the tenant's tokens (input + output) per UTC day;
	// past it the tenant's jobs wait for the next day.
	DailyTokens int64 `yaml:"daily_tokens"`
	// BacklogLimit is how many unfinished jobs the tenant may have before
	// its HTTP submissions get 429 (0: only the global hard limit applies).
	BacklogLimit int64 `yaml:"backlog_limit"`
	// BrokerUsers are the broker users (RabbitMQ user_id, Kafka principal)
	// whose raw publishes belong to this tenant; a publish by one of them
	// cannot claim another tenant, and this tenant's jobs can come from no
	// other user.
	BrokerUsers []string `yaml:"broker_users"`
	// Retention overrides how long the tenant's finished jobs are kept (retention.go).
	Retention TenantRetention `yaml:"retention"`
}

// Price is a model's price per million tokens, in the operator's currency.
type Price struct {
	InputPerMillion  float64 `yaml:"input_per_million"`
	OutputPerMillion float64 `yaml:"output_per_million"`
}

// Cost is what inputTokens and outputTokens cost at p.
func (p Price) Cost(inputTokens, outputTokens int64) float64 {
	return (float64(inputTokens)*p.InputPerMillion + float64(outputTokens)*p.OutputPerMillion) / 1e6
}

// TenantWeight is the tenant's weight: its configured one, or 1.
func (c Config) TenantWeight(tenant string) float64 {
	if t, ok := c.Tenants[tenant]; ok && t.Weight > 0 {
		return t.Weight
	}
	return 1
}

// BrokerUserTenants maps each configured broker user to its tenant.
func (c Config) BrokerUserTenants() map[string]string {
	out := map[string]string{}
	for name, t := range c.Tenants {
		for _, u := range t.BrokerUsers {
			out[u] = name
		}
	}
	return out
}

// validateTenantLimits checks weights, caps and broker users.
func (c Config) validateTenantLimits() error {
	names := make([]string, 0, len(c.Tenants))
	for name := range c.Tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	users := map[string]string{}
	for _, name := range names {
		t, key := c.Tenants[name], "tenants."+name
		switch {
		case t.Weight < 0:
			return badKey(key+".weight", "must be positive")
		case t.RPM < 0:
			return badKey(key+".rpm", "must not be negative")
		case t.TPM < 0:
			return badKey(key+".tpm", "must not be negative")
		case t.DailyTokens < 0:
			return badKey(key+".daily_tokens", "must not be negative")
		case t.BacklogLimit < 0:
			return badKey(key+".backlog_limit", "must not be negative")
		}
		for _, u := range t.BrokerUsers {
			if other, dup := users[u]; dup {
				return badKey(key+".broker_users", "broker user %q already belongs to tenant %q", u, other)
			}
			users[u] = name
		}
	}
	for name, m := range c.Models {
		if m.Price.InputPerMillion < 0 || m.Price.OutputPerMillion < 0 {
			return badKey(fmt.Sprintf("models.%s.price", name), "must not be negative")
		}
	}
	return nil
}

// badKey is a validation error naming the key.
func badKey(key, format string, args ...any) error {
	return fmt.Errorf("config: %s: %s", key, fmt.Sprintf(format, args...))
}
