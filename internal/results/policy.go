package results

import (
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/webhook"
)

// Policy judges, when a job enters llmq (the API's submit, the
// ingester's intake), the destinations that depend on the operator's
// configuration: a callback_url must name a host of the tenant's
// webhook_hosts, and a result_topic one of its result_topics. The syntax of
// every destination field is job.Validate's.
//
// A callback host written as an IP address that is not public (loopback,
// private, link-local such as 169.254.169.254, ...) is refused unless
// webhooks.allow_private, even if listed. Host names are not resolved here:
// what a name resolves to can change before the delivery (DNS rebinding),
// so the webhook client checks the address it actually dials instead.
type Policy struct {
	tenants      map[string]config.Tenant
	allowPrivate bool
	allowHTTP    bool
}

// NewPolicy is the policy of cfg's tenants and webhooks settings.
func NewPolicy(cfg config.Config) *Policy {
	return &Policy{tenants: cfg.Tenants, allowPrivate: cfg.Webhooks.AllowPrivate, allowHTTP: cfg.Webhooks.AllowHTTP}
}

// Check returns nil when j's destinations are allowed, else a
// *job.ValidationError naming the field (callback_url or result_topic).
func (p *Policy) Check(j job.Job) error {
	t := p.tenants[j.Tenant]
	if j.CallbackURL != "" {
		if err := p.checkCallback(t, j.CallbackURL); err != nil {
			return err
		}
	}
	if j.ResultTopic != "" && !slices.Contains(t.ResultTopics, j.ResultTopic) {
		return &job.ValidationError{Field: "result_topic", Rule: fmt.Sprintf("%q is not one of the tenant's result topics (tenants.<tenant>.result_topics)", j.ResultTopic)}
	}
	return nil
}

func (p *Policy) checkCallback(t config.Tenant, raw string) error {
	bad := func(format string, args ...any) error {
		return &job.ValidationError{Field: "callback_url", Rule: fmt.Sprintf(format, args...)}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return bad("must be an absolute http or https URL")
	}
	if u.Scheme == "http" && !p.allowHTTP {
		return bad("must use https")
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if addr, err := netip.ParseAddr(host); err == nil {
		if !p.allowPrivate && !webhook.Public(addr) {
			return bad("%s is not a public address (loopback, private, link-local and other internal addresses are refused)", addr)
		}
	} else if !p.allowPrivate && (host == "localhost" || strings.HasSuffix(host, ".localhost")) {
		return bad("%q names this machine", host)
	}
	if !hostAllowed(t.WebhookHosts, host) {
		return bad("host %q is not one of the tenant's webhook hosts (tenants.<tenant>.webhook_hosts)", host)
	}
	if t.WebhookSecret == "" {
		return bad("the tenant has no webhook secret to sign with (tenants.<tenant>.webhook_secret)")
	}
	return nil
}

// hostAllowed reports whether host matches one of allowed: an exact name,
// or "*.example.com" for any name below example.com (not example.com
// itself).
func hostAllowed(allowed []string, host string) bool {
	for _, a := range allowed {
		a = strings.TrimSuffix(strings.ToLower(a), ".")
		if suffix, ok := strings.CutPrefix(a, "*"); ok {
			if strings.HasSuffix(host, suffix) && len(host) > len(suffix) {
				return true
			}
			continue
		}
		if host == a {
			return true
		}
	}
	return false
}
