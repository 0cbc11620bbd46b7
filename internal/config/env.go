package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// EnvName returns the variable that overrides a YAML path such as
// "provider.base_url": LLMQ_PROVIDER_BASE_URL. Dots and hyphens (in
// provider names) become underscores.
func EnvName(yamlPath string) string {
	return "LLMQ_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(yamlPath))
}

// EnvNames lists every variable Load reads, for docs and deployment checks.
// The variables of entries of providers: (LLMQ_PROVIDERS_<NAME>_API_KEY, …)
// depend on the names and are not listed.
func EnvNames() []string {
	var out []string
	walkScalars(reflect.ValueOf(&Config{}).Elem(), "", func(path string, _ reflect.Value) error {
		out = append(out, EnvName(path))
		return nil
	})
	return out
}

// applyEnv overrides every scalar field (and the comma-separated lists and
// api_keys) from LLMQ_* variables, and those of each provider the YAML
// names under providers: (LLMQ_PROVIDERS_<NAME>_<FIELD>, so a key can come
// from a secret). Models are configured in YAML only: model names do not
// map cleanly onto variable names.
func applyEnv(c *Config, env func(string) (string, bool)) error {
	if err := walkScalars(reflect.ValueOf(c).Elem(), "", envSetter(env)); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		p := c.Providers[name]
		if err := walkScalars(reflect.ValueOf(&p).Elem(), "providers."+name, envSetter(env)); err != nil {
			return err
		}
		c.Providers[name] = p
	}
	return nil
}

// envSetter sets a field from the variable of its path, when set.
func envSetter(env func(string) (string, bool)) func(path string, v reflect.Value) error {
	return func(path string, v reflect.Value) error {
		raw, ok := env(EnvName(path))
		if !ok {
			return nil
		}
		if err := setFromString(v, raw); err != nil {
			// Never echo the value: it may be a key.
			return fmt.Errorf("config: %s (%s): %w", path, EnvName(path), err)
		}
		return nil
	}
}

var (
	durationType = reflect.TypeOf(time.Duration(0))
	apiKeysType  = reflect.TypeOf(APIKeys{})
)

func walkScalars(v reflect.Value, prefix string, fn func(path string, v reflect.Value) error) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		path := tag
		if prefix != "" {
			path = prefix + "." + tag
		}
		fv := v.Field(i)
		switch {
		case fv.Kind() == reflect.Struct:
			if err := walkScalars(fv, path, fn); err != nil {
				return err
			}
		case fv.Kind() == reflect.Map && fv.Type() != apiKeysType:
			// models:, providers: and headers: YAML only (see applyEnv).
		default:
			if err := fn(path, fv); err != nil {
				return err
			}
		}
	}
	return nil
}

func setFromString(v reflect.Value, raw string) error {
	raw = strings.TrimSpace(raw)
	switch {
	case v.Type() == durationType:
		d, err := time.ParseDuration(raw)
		if err != nil {
			return fmt.Errorf("want a duration such as 30s")
		}
		v.SetInt(int64(d))
	case v.Type() == apiKeysType:
		keys, err := ParseAPIKeys(raw)
		if err != nil {
			return err
		}
		v.Set(reflect.ValueOf(keys))
	case v.Kind() == reflect.String:
		v.SetString(raw)
	case v.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return fmt.Errorf("want true or false")
		}
		v.SetBool(b)
	case v.Kind() == reflect.Int || v.Kind() == reflect.Int64:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return fmt.Errorf("want an integer")
		}
		v.SetInt(n)
	case v.Kind() == reflect.Float64:
		f, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return fmt.Errorf("want a number")
		}
		v.SetFloat(f)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		items := reflect.MakeSlice(v.Type(), 0, 0)
		for _, s := range strings.Split(raw, ",") {
			if s = strings.TrimSpace(s); s != "" {
				items = reflect.Append(items, reflect.ValueOf(s).Convert(v.Type().Elem()))
			}
		}
		v.Set(items)
	default:
		return fmt.Errorf("unsupported type %s", v.Type())
	}
	return nil
}
