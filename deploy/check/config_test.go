package check

import (
	"fmt"
	"path"
	"strings"

	"github.com/llmq/llmq/internal/config"
)

// checkEnv: every LLMQ_* variable a container sets, directly or through
// envFrom, is one the binaries read; envFrom sources exist.
func checkEnv(cs []container, known map[string]bool, sources map[string]map[string]string) []error {
	var errs []error
	for _, c := range cs {
		for name := range c.env {
			if strings.HasPrefix(name, "LLMQ_") && !known[name] {
				errs = append(errs, fmt.Errorf("%s: env %s is not in the configuration contract (config.EnvNames)", c.where, name))
			}
		}
		for _, from := range c.envFrom {
			kv, ok := sources[from]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: envFrom %s is not in the manifests", c.where, from))
				continue
			}
			for name := range kv {
				if !known[name] {
					errs = append(errs, fmt.Errorf("%s: envFrom %s key %s is not an LLMQ_* variable the binaries read", c.where, from, name))
				}
			}
		}
	}
	return errs
}

// containerConfig loads the configuration the container's binary will run
// with: the file LLMQ_CONFIG names (it must be mounted) under the
// container's environment.
func containerConfig(c container, secrets map[string]map[string]string) (config.Config, error) {
	var data []byte
	if p := c.env["LLMQ_CONFIG"]; p != "" {
		content, ok := c.files[p]
		if !ok {
			return config.Config{}, fmt.Errorf("%s: LLMQ_CONFIG %s is not a file mounted into the container", c.where, p)
		}
		data = []byte(content)
	}
	cfg, err := config.Parse(data, c.lookup(secrets))
	if err != nil {
		return cfg, fmt.Errorf("%s: %w", c.where, err)
	}
	return cfg, nil
}

// checkConfigs: mounts exist; every llmq container's configuration loads
// (unknown keys fail); the provider key file lies in a mounted directory;
// llmsim's --config file is mounted.
func checkConfigs(cs []container, secrets map[string]map[string]string) []error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.mountErrs...)
		switch c.binary() {
		case "producer", "consumer", "llmq":
			cfg, err := containerConfig(c, secrets)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if f := cfg.Provider.APIKeyFile; f != "" {
				if _, ok := c.files[path.Dir(f)+"/"]; !ok {
					if _, ok := c.files[f]; !ok {
						errs = append(errs, fmt.Errorf("%s: provider.api_key_file %s is in no mounted volume", c.where, f))
					}
				}
			}
		case "llmsim":
			if p := flagValue(c.command, "--config"); p != "" {
				if _, ok := c.files[p]; !ok {
					errs = append(errs, fmt.Errorf("%s: llmsim --config %s is not a file mounted into the container", c.where, p))
				}
			}
		}
	}
	return errs
}

func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// checkGrace: a consumer is given more time to stop than its longest job
// can take: provider.timeout + provider.wait_timeout + worker.shutdown_grace.
func checkGrace(cs []container, secrets map[string]map[string]string) []error {
	var errs []error
	for _, c := range cs {
		if c.binary() != "consumer" {
			continue
		}
		cfg, err := containerConfig(c, secrets)
		if err != nil {
			continue // reported by checkConfigs
		}
		need := cfg.Provider.Timeout + cfg.Provider.WaitTimeout + cfg.Worker.ShutdownGrace
		if c.stopGrace <= need {
			errs = append(errs, fmt.Errorf("%s: stop grace %s must exceed provider.timeout + provider.wait_timeout + worker.shutdown_grace = %s", c.where, c.stopGrace, need))
		}
	}
	return errs
}
