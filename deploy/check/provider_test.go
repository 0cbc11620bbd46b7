package check

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
)

// simulator is what checkSimProvider needs of an llmsim configuration.
type simulator struct {
	keys   []string
	models map[string][2]int64 // rpm, tpm; 0 = unlimited
}

var baseURL = regexp.MustCompile(`^https?://([^/:]+)(?::(\d+))?(/.*)$`)

// checkSimProvider: every llmsim container's --config loads; a consumer
// whose provider.base_url points at an llmsim service calls it on its port
// and API path, with a key it accepts, for models it serves, with quotas
// no higher than the simulator enforces.
func checkSimProvider(cs []container, secrets map[string]map[string]string, parse func([]byte) (simulator, error)) []error {
	var errs []error
	type sim struct {
		port string
		cfg  simulator
	}
	sims := map[string]sim{}
	for _, c := range cs {
		if c.binary() != "llmsim" {
			continue
		}
		p := flagValue(c.command, "--config")
		content, ok := c.files[p]
		if !ok {
			continue // reported by checkConfigs
		}
		cfg, err := parse([]byte(content))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: llmsim --config %s: %w", c.where, p, err))
			continue
		}
		_, port, _ := net.SplitHostPort(flagValue(c.command, "--addr"))
		sims[c.owner] = sim{port: port, cfg: cfg}
	}
	for _, c := range cs {
		if c.binary() != "consumer" {
			continue
		}
		cfg, err := containerConfig(c, secrets)
		if err != nil {
			continue // reported by checkConfigs
		}
		m := baseURL.FindStringSubmatch(cfg.Provider.BaseURL)
		if m == nil {
			continue
		}
		s, ok := sims[m[1]]
		if !ok {
			continue // a real provider
		}
		if m[2] != s.port {
			errs = append(errs, fmt.Errorf("%s: provider.base_url %s, but llmsim %s listens on port %s", c.where, cfg.Provider.BaseURL, m[1], s.port))
		}
		if p := strings.TrimSuffix(m[3], "/"); p != "/v1" && p != "/compatible-mode/v1" {
			errs = append(errs, fmt.Errorf("%s: provider.base_url path %s: llmsim serves /v1 and /compatible-mode/v1", c.where, m[3]))
		}
		if len(s.cfg.keys) > 0 && !slices.Contains(s.cfg.keys, cfg.Provider.APIKey.Reveal()) {
			errs = append(errs, fmt.Errorf("%s: provider key is not one of llmsim %s's api_keys", c.where, m[1]))
		}
		for _, name := range sortedKeys(cfg.Models) {
			lim, ok := s.cfg.models[name]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: model %s is not served by llmsim %s", c.where, name, m[1]))
				continue
			}
			mc := cfg.Models[name]
			if (lim[0] > 0 && (mc.RPM == 0 || mc.RPM > float64(lim[0]))) || (lim[1] > 0 && (mc.TPM == 0 || mc.TPM > float64(lim[1]))) {
				errs = append(errs, fmt.Errorf("%s: model %s quota rpm %v tpm %v exceeds what llmsim %s enforces (rpm %d tpm %d)", c.where, name, mc.RPM, mc.TPM, m[1], lim[0], lim[1]))
			}
		}
	}
	return errs
}
