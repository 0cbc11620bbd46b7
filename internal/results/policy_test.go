package results_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
)

const secret = config.Secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")

func policyConfig(w config.Webhooks) config.Config {
	return config.Config{
		Tenants: map[string]config.Tenant{
			"acme": {
				WebhookSecret: secret,
				// IP literals listed on purpose: the address rule refuses
				// them anyway.
				WebhookHosts: []string{"hooks.acme.example", "*.acme.dev", "10.0.0.1", "127.0.0.1", "169.254.169.254"},
				ResultTopics: []string{"acme.results"},
			},
			"nosecret": {ResultTopics: []string{"x"}},
		},
		Webhooks: w,
	}
}

func TestPolicyRefuses(t *testing.T) {
	p := results.NewPolicy(policyConfig(config.Webhooks{}))
	for _, tc := range []struct {
		name, tenant, url, topic, field, says string
	}{
		{"loopback", "acme", "https://127.0.0.1/hook", "", "callback_url", "not a public address"},
		{"metadata service", "acme", "https://169.254.169.254/latest/meta-data", "", "callback_url", "not a public address"},
		{"private", "acme", "https://10.0.0.1:8443/hook", "", "callback_url", "not a public address"},
		{"mapped loopback", "acme", "https://[::ffff:127.0.0.1]/hook", "", "callback_url", "not a public address"},
		{"ipv6 loopback", "acme", "https://[::1]/hook", "", "callback_url", "not a public address"},
		{"localhost", "acme", "https://localhost/hook", "", "callback_url", "names this machine"},
		{"outside the allow-list", "acme", "https://evil.example/hook", "", "callback_url", "not one of the tenant's webhook hosts"},
		{"the wildcard's own domain", "acme", "https://acme.dev/hook", "", "callback_url", "not one of the tenant's webhook hosts"},
		{"a lookalike", "acme", "https://hooks.acme.example.evil.example/hook", "", "callback_url", "not one of the tenant's webhook hosts"},
		{"plain http", "acme", "http://hooks.acme.example/hook", "", "callback_url", "must use https"},
		{"tenant without hosts", "globex", "https://hooks.acme.example/hook", "", "callback_url", "not one of the tenant's webhook hosts"},
		{"topic not listed", "acme", "", "other.results", "result_topic", "not one of the tenant's result topics"},
		{"tenant without topics", "globex", "", "acme.results", "result_topic", "not one of the tenant's result topics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := p.Check(job.Job{Tenant: tc.tenant, ID: "j1", CallbackURL: tc.url, ResultTopic: tc.topic})
			var v *job.ValidationError
			require.True(t, errors.As(err, &v), "got %v", err)
			assert.Equal(t, tc.field, v.Field)
			assert.Contains(t, v.Error(), tc.says)
			assert.NotContains(t, v.Error(), "MfKQ9r8G", "never the secret")
		})
	}
}

func TestPolicyAllows(t *testing.T) {
	p := results.NewPolicy(policyConfig(config.Webhooks{}))
	for _, u := range []string{"https://hooks.acme.example/hook?token=x", "https://HOOKS.acme.example./h", "https://a.b.acme.dev:8443/h"} {
		assert.NoError(t, p.Check(job.Job{Tenant: "acme", CallbackURL: u, ResultTopic: "acme.results"}), u)
	}
	assert.NoError(t, p.Check(job.Job{Tenant: "globex"}), "no destinations, nothing to judge")

	open := results.NewPolicy(policyConfig(config.Webhooks{AllowPrivate: true, AllowHTTP: true}))
	for _, u := range []string{"http://127.0.0.1:9000/hook", "https://10.0.0.1/hook", "http://hooks.acme.example/hook"} {
		assert.NoError(t, open.Check(job.Job{Tenant: "acme", CallbackURL: u}), u)
	}
	assert.Error(t, open.Check(job.Job{Tenant: "acme", CallbackURL: "http://192.168.1.1/hook"}), "allow_private does not lift the allow-list")
}

func TestPolicyNeedsASecret(t *testing.T) {
	cfg := policyConfig(config.Webhooks{})
	cfg.Tenants["nosecret"] = config.Tenant{WebhookHosts: []string{"hooks.example"}}
	err := results.NewPolicy(cfg).Check(job.Job{Tenant: "nosecret", CallbackURL: "https://hooks.example/h"})
	var v *job.ValidationError
	require.True(t, errors.As(err, &v))
	assert.Equal(t, "callback_url", v.Field)
	assert.Contains(t, v.Rule, "no webhook secret")
}
