package config

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/job"
)

// Tenant is what the operator sets for one tenant: where its results may go
// (docs/design.md#results) and its share, limits and identities
// (docs/design.md#tenants).
type Tenant struct {
	// WebhookURL, when set, receives every finished job of the tenant, on
	// top of any callback_url a job names.
	WebhookURL string `yaml:"webhook_url"`
	// WebhookSecret signs the tenant's webhooks (Standard Webhooks:
	// "whsec_" and base64 of 24 to 64 random bytes). Required when the
	// tenant has a webhook_url or webhook_hosts.
	WebhookSecret Secret `yaml:"webhook_secret"`
	// WebhookSecretFile, when set, is read for the secret (a mounted secret).
	WebhookSecretFile string `yaml:"webhook_secret_file"`
	// WebhookHosts are the hosts a job's callback_url may name: exact names,
	// or "*.example.com" for any subdomain. Empty: jobs may name none.
	WebhookHosts []string `yaml:"webhook_hosts"`
	// ResultTopics are the Kafka topics a job of the tenant may name as its
	// result_topic.
	ResultTopics []string `yaml:"result_topics"`

	// TenantLimits: weight, caps, budget and broker identity (tenants.go).
	TenantLimits `yaml:",inline"`
}

// Webhooks tunes webhook delivery (internal/webhook).
type Webhooks struct {
	// AllowPrivate lets webhooks reach loopback, private, link-local and
	// other non-public addresses (a test stack, an internal receiver).
	AllowPrivate bool `yaml:"allow_private"`
	// AllowHTTP lets callback URLs use plain http (default: https only).
	AllowHTTP bool `yaml:"allow_http"`
	// Timeout bounds one delivery attempt (default 10s).
	Timeout time.Duration `yaml:"timeout"`
	// RetryFor is how long a failing delivery is retried before it is dead
	// (default 25h; at least 24h).
	RetryFor time.Duration `yaml:"retry_for"`
	// MaxResponseBytes caps how much of a receiver's answer is read (default 64 KiB).
	MaxResponseBytes int64 `yaml:"max_response_bytes"`
	// Concurrency is how many deliveries one consumer sends at once (default 16).
	Concurrency int `yaml:"concurrency"`
}

// hostPattern is a webhook host: a name, or "*." and a domain.
var hostPattern = regexp.MustCompile(`^(\*\.)?[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*$`)

func (w *Webhooks) withDefaults() {
	if w.Timeout == 0 {
		w.Timeout = 10 * time.Second
	}
	if w.RetryFor == 0 {
		w.RetryFor = 25 * time.Hour
	}
	if w.MaxResponseBytes == 0 {
		w.MaxResponseBytes = 64 << 10
	}
	if w.Concurrency == 0 {
		w.Concurrency = 16
	}
}

// resolveTenantSecrets reads webhook secrets from their files.
func (c *Config) resolveTenantSecrets() error {
	for name, t := range c.Tenants {
		if t.WebhookSecretFile == "" {
			continue
		}
		data, err := os.ReadFile(t.WebhookSecretFile)
		if err != nil {
			return fmt.Errorf("tenants.%s.webhook_secret_file: %w", name, err)
		}
		t.WebhookSecret = Secret(strings.TrimSpace(string(data)))
		c.Tenants[name] = t
	}
	return nil
}

// validateResults checks tenants and webhooks.
func (c Config) validateResults() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("config: %s: %s", key, fmt.Sprintf(format, args...))
	}
	for key, tenant := range c.APIKeys {
		if !job.ValidTenant(tenant) {
			_ = key // the key is secret: name only the tenant
			return bad("api_keys", "tenant %q must be 1..64 characters of [A-Za-z0-9_-] (no dots)", tenant)
		}
	}
	names := make([]string, 0, len(c.Tenants))
	for name := range c.Tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t, key := c.Tenants[name], "tenants."+name
		if !job.ValidTenant(name) {
			return bad(key, "a tenant name must be 1..64 characters of [A-Za-z0-9_-] (no dots)")
		}
		if (t.WebhookURL != "" || len(t.WebhookHosts) > 0) && t.WebhookSecret == "" {
			return bad(key+".webhook_secret", "required when webhook_url or webhook_hosts is set")
		}
		if t.WebhookSecret != "" {
			if _, err := DecodeWebhookSecret(t.WebhookSecret); err != nil {
				return bad(key+".webhook_secret", "%v", err)
			}
		}
		if t.WebhookURL != "" {
			u, err := url.Parse(t.WebhookURL)
			if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				return bad(key+".webhook_url", "must be an absolute http(s) URL")
			}
			if u.Scheme == "http" && !c.Webhooks.AllowHTTP {
				return bad(key+".webhook_url", "must use https (or set webhooks.allow_http)")
			}
		}
		for _, h := range t.WebhookHosts {
			if !hostPattern.MatchString(h) {
				return bad(key+".webhook_hosts", "%q is not a host name (or *.domain)", h)
			}
		}
		for _, topic := range t.ResultTopics {
			if !job.ValidTopic(topic) || strings.HasPrefix(topic, "llmq.") {
				return bad(key+".result_topics", "%q must be a Kafka topic name outside llmq.*", topic)
			}
		}
	}
	w := c.Webhooks
	if w.Timeout < 0 || w.MaxResponseBytes < 0 || w.Concurrency < 0 {
		return bad("webhooks", "timeout, max_response_bytes and concurrency must not be negative")
	}
	if w.RetryFor < 24*time.Hour {
		return bad("webhooks.retry_for", "must be at least 24h, got %s", w.RetryFor)
	}
	return nil
}

// DecodeWebhookSecret returns the key bytes of a Standard Webhooks secret
// ("whsec_" + base64). Its error never contains the secret.
func DecodeWebhookSecret(s Secret) ([]byte, error) {
	raw, ok := strings.CutPrefix(s.Reveal(), "whsec_")
	if !ok {
		return nil, fmt.Errorf(`must start with "whsec_"`)
	}
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return nil, fmt.Errorf("must be whsec_ followed by standard base64")
	}
	if len(key) < 24 || len(key) > 64 {
		return nil, fmt.Errorf("must hold 24 to 64 bytes, holds %d", len(key))
	}
	return key, nil
}
