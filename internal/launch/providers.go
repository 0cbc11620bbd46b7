package launch

import (
	"errors"
	"fmt"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/provider"
)

// providerRouter builds a client for every provider the models use and
// the router that sends each model to its own (docs/design.md#providers).
// closeAll releases the clients.
func providerRouter(cfg config.Config, opts Options) (r *provider.Router, closeAll func(), err error) {
	set := cfg.ProviderSet()
	clients := map[string]*provider.Client{}
	closeAll = func() {
		for _, c := range clients {
			c.Close()
		}
	}
	for _, name := range cfg.ProvidersInUse() {
		p := set[name]
		if p.BaseURL == "" {
			closeAll()
			if _, named := cfg.Providers[name]; !named {
				return nil, nil, errors.New("config: provider.base_url (LLMQ_PROVIDER_BASE_URL) is required")
			}
			return nil, nil, fmt.Errorf("config: providers.%s.base_url (%s) is required", name, config.EnvName("providers."+name+".base_url"))
		}
		c, err := provider.New(provider.Config{
			BaseURL: p.BaseURL, NativeBaseURL: p.NativeBaseURL, APIKey: p.APIKey, Headers: p.Headers, Timeout: p.Timeout,
			WaitTimeout: p.WaitTimeout, Stream: p.Stream, MaxConns: cfg.Worker.MaxInFlight,
			Transport: opts.ProviderTransport,
		})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("provider %s: %w", name, err)
		}
		clients[name] = c
	}
	routes := make(map[string]provider.Route, len(cfg.Models))
	for name := range cfg.Models {
		rt := cfg.Route(name)
		routes[name] = provider.Route{Client: clients[rt.Provider], Upstream: rt.Upstream}
	}
	// With no models configured every job goes to the default provider
	// under its own model name, as before providers: existed.
	return provider.NewRouter(routes, clients[config.DefaultProvider]), closeAll, nil
}

// quotaModels keys the models' limits by their shared-quota keys
// (config.QuotaKey: provider and upstream name) for quota.New, and maps
// each key back to its model, whose governor admits for it.
func quotaModels(cfg config.Config) (byKey map[string]config.Model, model map[string]string) {
	byKey = make(map[string]config.Model, len(cfg.Models))
	model = make(map[string]string, len(cfg.Models))
	for name, m := range cfg.Models {
		k := cfg.QuotaKey(name)
		// The quota shares what the governor meters (audio seconds for an
		// audio model).
		byKey[k], model[k] = m.Metered(), name
	}
	return byKey, model
}
