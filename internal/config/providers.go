package config

import (
	"fmt"
	"maps"
	"net/textproto"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// DefaultProvider names the implicit provider built from the provider:
// section; models that name no provider use it, so configs written before
// providers: existed keep working unchanged (docs/design.md#providers).
const DefaultProvider = "default"

// Provider dialects.
const (
	DialectOpenAI    = "openai"
	DialectDashScope = "dashscope"
)

// providerName is what a key under providers: may be: it becomes part of
// an environment variable's name and of the shared-quota key, whose
// separator is "/".
var providerName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ProviderSet returns every provider by name: the entries of providers:
// and, unless providers: names one itself, "default" from the provider:
// section (which may lack a base URL: only the consumer needs one, and only
// for a provider some model uses, see ProvidersInUse).
func (c Config) ProviderSet() map[string]Provider {
	out := make(map[string]Provider, len(c.Providers)+1)
	for name, p := range c.Providers {
		out[name] = p
	}
	if _, ok := out[DefaultProvider]; !ok {
		out[DefaultProvider] = c.Provider
	}
	return out
}

// Route is where a model's calls go: a provider of ProviderSet and the
// model's name there.
type Route struct {
	Provider string
	Upstream string
}

// Route returns model's route. A model missing from models: (llmq runs
// with none configured) is served by the default provider under its own
// name.
func (c Config) Route(model string) Route {
	m := c.Models[model]
	r := Route{Provider: m.Provider, Upstream: m.Upstream}
	if r.Provider == "" {
		r.Provider = DefaultProvider
	}
	if r.Upstream == "" {
		r.Upstream = model
	}
	return r
}

// QuotaKey is the name model's limits are shared under in Postgres
// (docs/design.md#shared-quota): providers limit an account per model, so
// the key is the provider and the upstream name, and one upstream model on
// two providers has two quotas. Models of the default provider keep their
// bare upstream name, the key of configs before providers: existed, so
// replicas of both versions share one quota during a rolling upgrade.
func (c Config) QuotaKey(model string) string {
	r := c.Route(model)
	if r.Provider == DefaultProvider {
		return r.Upstream
	}
	return r.Provider + "/" + r.Upstream
}

// ProvidersInUse lists the providers the consumer must reach, sorted: those
// its models name, or the default provider when no models are configured.
func (c Config) ProvidersInUse() []string {
	if len(c.Models) == 0 {
		return []string{DefaultProvider}
	}
	var out []string
	for name := range c.Models {
		if p := c.Route(name).Provider; !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// withDefaults fills a provider's unset settings.
func (p *Provider) withDefaults() {
	if p.Timeout == 0 {
		p.Timeout = 120 * time.Second
	}
	if p.Dialect == "" {
		p.Dialect = DialectOpenAI
	}
}

// providersWithDefaults applies each provider's and model's defaults.
func (c *Config) providersWithDefaults() {
	c.Provider.withDefaults()
	for name, p := range c.Providers {
		p.withDefaults()
		c.Providers[name] = p
	}
	for name, m := range c.Models {
		r := c.Route(name)
		m.Provider, m.Upstream = r.Provider, r.Upstream
		c.Models[name] = m
	}
}

// resolveProviderKeys reads each provider's key from its api_key_file.
func (c *Config) resolveProviderKeys() error {
	read := func(key string, p *Provider) error {
		if p.APIKeyFile == "" {
			return nil
		}
		data, err := os.ReadFile(p.APIKeyFile)
		if err != nil {
			// The path is not secret; the content is never in the message.
			return fmt.Errorf("%s.api_key_file: %w", key, err)
		}
		p.APIKey = Secret(strings.TrimSpace(string(data)))
		return nil
	}
	if err := read("provider", &c.Provider); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		p := c.Providers[name]
		if err := read("providers."+name, &p); err != nil {
			return err
		}
		c.Providers[name] = p
	}
	return nil
}

// validateProviders checks providers:, the provider: section and every
// model's route.
func (c Config) validateProviders() error {
	if _, ok := c.Providers[DefaultProvider]; ok && c.Provider.BaseURL != "" {
		return badKey("providers."+DefaultProvider, "is also set by provider.base_url: keep one of the two")
	}
	if err := c.Provider.validate("provider", false); err != nil {
		return err
	}
	envNames := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		key := "providers." + name
		if !providerName.MatchString(name) {
			return badKey(key, "a provider name is 1..64 of [A-Za-z0-9_-]")
		}
		if other, ok := envNames[EnvName(key)]; ok {
			return badKey(key, "has the environment variables of providers.%s (%s_*)", other, EnvName(key))
		}
		envNames[EnvName(key)] = name
		if err := c.Providers[name].validate(key, true); err != nil {
			return err
		}
	}
	set := c.ProviderSet()
	routes := map[Route]string{}
	for _, name := range slices.Sorted(maps.Keys(c.Models)) {
		r := c.Route(name)
		if _, ok := set[r.Provider]; !ok {
			return badKey("models."+name+".provider", "names %q, which is not under providers:", r.Provider)
		}
		if other, ok := routes[r]; ok {
			// One quota cannot be admitted by two governors.
			return badKey("models."+name, "names the same provider and upstream model as models.%s (%s/%s)", other, r.Provider, r.Upstream)
		}
		routes[r] = name
	}
	return nil
}

// validate checks one provider's settings; key is its YAML path.
func (p Provider) validate(key string, needURL bool) error {
	isURL := func(s string) bool { return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") }
	switch {
	case needURL && p.BaseURL == "":
		return badKey(key+".base_url", "required (%s)", EnvName(key+".base_url"))
	case p.BaseURL != "" && !isURL(p.BaseURL):
		return badKey(key+".base_url", "must be an http(s) URL")
	case p.NativeBaseURL != "" && !isURL(p.NativeBaseURL):
		return badKey(key+".native_base_url", "must be an http(s) URL")
	case p.Dialect != DialectOpenAI && p.Dialect != DialectDashScope:
		return badKey(key+".dialect", "must be openai or dashscope, got %q", p.Dialect)
	case p.NativeBaseURL != "" && p.Dialect != DialectDashScope:
		return badKey(key+".native_base_url", "is DashScope's native API: set dialect: dashscope")
	case p.Timeout < 0 || p.WaitTimeout < 0:
		return badKey(key+".timeout", "must not be negative")
	}
	for _, h := range slices.Sorted(maps.Keys(p.Headers)) {
		canon := textproto.CanonicalMIMEHeaderKey(h)
		switch {
		case !validHeaderName(h):
			return badKey(key+".headers", "%q is not a header name", h)
		case canon == "Authorization":
			return badKey(key+".headers."+h, "the key goes in api_key")
		case canon == "Content-Type" || canon == "Accept" || canon == "X-Dashscope-Wait-Timeout":
			return badKey(key+".headers."+h, "is set by llmq")
		}
	}
	return nil
}

func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for _, r := range h {
		if r > 0x7e || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}
