package check

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// container is one container of a compose service or a Kubernetes workload,
// reduced to what the checks read.
type container struct {
	where   string   // for messages: "docker-compose.yml service producer"
	owner   string   // compose service name, or "Deployment/llmq-consumer"
	image   string   // as written
	command []string // entrypoint/command followed by args
	// env holds literal values; a valueFrom entry is present with "".
	env map[string]string
	// envFrom names the Secrets/ConfigMaps whose keys become variables.
	envFrom []string
	probes  []probe
	// ports maps named container ports (Kubernetes) to numbers; unnamed
	// ports are keyed by their number.
	ports map[string]int
	// files maps an absolute path inside the container to its content,
	// for mounted files the checks read (LLMQ_CONFIG, llmsim --config).
	// A mounted directory is recorded as path+"/" with "" content.
	files map[string]string
	// mountErrs are mounts whose source does not exist.
	mountErrs []error
	// stopGrace is compose stop_grace_period or terminationGracePeriodSeconds.
	stopGrace time.Duration
	// k8s securityContext, pod level merged under container level.
	security map[string]any
	k8s      bool
}

// probe is an HTTP health check: a Kubernetes httpGet probe or a compose
// healthcheck running healthprobe URL.
type probe struct {
	what string // "readinessProbe", "healthcheck"
	host string // compose only: the URL's host
	port string // number or a named port
	path string
}

// binary is the llmq binary the container runs ("" when none).
func (c container) binary() string {
	if len(c.command) == 0 {
		return ""
	}
	return path.Base(c.command[0])
}

// lookup is the container's environment as config.Parse reads it.
func (c container) lookup(secrets map[string]map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		if v, ok := c.env[name]; ok {
			return v, true
		}
		for _, from := range c.envFrom {
			if v, ok := secrets[from][name]; ok {
				return v, true
			}
		}
		return "", false
	}
}

// doc is one YAML document decoded generically.
type doc = map[string]any

func decodeAll(data []byte) ([]doc, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []doc
	for {
		var d doc
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if d != nil {
			out = append(out, d)
		}
	}
}

// get walks nested maps: get(d, "spec", "template").
func get(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func str(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	default:
		return fmt.Sprint(x)
	}
}

func list(v any) []any {
	l, _ := v.([]any)
	return l
}

func strs(v any) []string {
	switch x := v.(type) {
	case string:
		return strings.Fields(x)
	case []any:
		out := make([]string, len(x))
		for i, e := range x {
			out[i] = str(e)
		}
		return out
	}
	return nil
}

var interpolation = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}`)

// expand replaces compose ${VAR:-default} with its default: the value the
// stack runs with when the user sets nothing.
func expand(s string) string {
	return interpolation.ReplaceAllString(s, "$2")
}

// composeFile is docker-compose.yml decoded.
type composeFile struct {
	containers []container
	// services by name: the llmq ones are in containers too.
	services map[string]doc
	// builds maps an image name to the Dockerfile (relative to root) that builds it.
	builds map[string]string
}

func loadCompose(root, file string, data []byte) (composeFile, error) {
	var top doc
	if err := yaml.Unmarshal(data, &top); err != nil {
		return composeFile{}, fmt.Errorf("%s: %w", file, err)
	}
	cf := composeFile{services: map[string]doc{}, builds: map[string]string{}}
	services, _ := top["services"].(map[string]any)
	if len(services) == 0 {
		return cf, fmt.Errorf("%s: no services", file)
	}
	names := make([]string, 0, len(services))
	for n := range services {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		svc, _ := services[name].(map[string]any)
		cf.services[name] = svc
		c := container{
			where: fmt.Sprintf("%s service %s", file, name),
			owner: name,
			image: expand(str(svc["image"])),
			env:   map[string]string{},
			ports: map[string]int{},
			files: map[string]string{},
		}
		if b := svc["build"]; b != nil {
			ctx, df := ".", "Dockerfile"
			if s, ok := b.(string); ok {
				ctx = s
			} else {
				if v := str(get(b, "context")); v != "" {
					ctx = v
				}
				if v := str(get(b, "dockerfile")); v != "" {
					df = v
				}
			}
			cf.builds[c.image] = filepath.ToSlash(filepath.Join(ctx, df))
		}
		c.command = append(strs(svc["entrypoint"]), strs(svc["command"])...)
		for i := range c.command {
			c.command[i] = expand(c.command[i])
		}
		switch env := svc["environment"].(type) {
		case map[string]any:
			for k, v := range env {
				c.env[k] = expand(str(v))
			}
		case []any:
			for _, e := range env {
				k, v, _ := strings.Cut(str(e), "=")
				c.env[k] = expand(v)
			}
		}
		if hc := strs(get(svc, "healthcheck", "test")); len(hc) >= 3 && hc[0] == "CMD" && hc[1] == "healthprobe" {
			p, err := urlProbe("healthcheck", hc[2])
			if err != nil {
				return cf, fmt.Errorf("%s: %w", c.where, err)
			}
			c.probes = append(c.probes, p)
		}
		for _, v := range list(svc["volumes"]) {
			src, dst, ok := strings.Cut(str(v), ":")
			if !ok || !(strings.HasPrefix(src, "./") || strings.HasPrefix(src, "/")) {
				continue // named volume
			}
			dst, _, _ = strings.Cut(dst, ":")
			host := filepath.Join(root, filepath.FromSlash(src))
			fi, err := os.Stat(host)
			if err != nil {
				c.mountErrs = append(c.mountErrs, fmt.Errorf("%s: volume %s: %w", c.where, src, err))
				continue
			}
			if fi.IsDir() {
				c.files[strings.TrimSuffix(dst, "/")+"/"] = ""
				continue
			}
			content, err := os.ReadFile(host)
			if err != nil {
				return cf, err
			}
			c.files[dst] = string(content)
		}
		if g := str(svc["stop_grace_period"]); g != "" {
			d, err := time.ParseDuration(g)
			if err != nil {
				return cf, fmt.Errorf("%s: stop_grace_period: %w", c.where, err)
			}
			c.stopGrace = d
		} else {
			c.stopGrace = 10 * time.Second // compose's default
		}
		cf.containers = append(cf.containers, c)
	}
	return cf, nil
}

var probeURL = regexp.MustCompile(`^http://([^/:]+):(\d+)(/[^?#]*)$`)

func urlProbe(what, u string) (probe, error) {
	m := probeURL.FindStringSubmatch(u)
	if m == nil {
		return probe{}, fmt.Errorf("%s: healthprobe URL %q is not http://host:port/path", what, u)
	}
	return probe{what: what, host: m[1], port: m[2], path: m[3]}, nil
}

// k8sObject is one manifest document with where it came from.
type k8sObject struct {
	file string
	doc  doc
}

func (o k8sObject) kind() string { return str(o.doc["kind"]) }
func (o k8sObject) name() string { return str(get(o.doc, "metadata", "name")) }
func (o k8sObject) where() string {
	return fmt.Sprintf("%s %s/%s", o.file, o.kind(), o.name())
}

// k8sSet is every manifest under deploy/k8s, indexed.
type k8sSet struct {
	objects    []k8sObject
	secrets    map[string]map[string]string // name → key → value
	configMaps map[string]map[string]string
	containers []container
}

func loadK8s(files map[string][]byte) (k8sSet, error) {
	s := k8sSet{secrets: map[string]map[string]string{}, configMaps: map[string]map[string]string{}}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, file := range names {
		docs, err := decodeAll(files[file])
		if err != nil {
			return s, fmt.Errorf("%s: %w", file, err)
		}
		for _, d := range docs {
			o := k8sObject{file: file, doc: d}
			s.objects = append(s.objects, o)
			switch o.kind() {
			case "Secret":
				kv := map[string]string{}
				data, _ := d["data"].(map[string]any)
				for k, v := range data {
					raw, err := base64.StdEncoding.DecodeString(str(v))
					if err != nil {
						return s, fmt.Errorf("%s: data.%s is not base64", o.where(), k)
					}
					kv[k] = string(raw)
				}
				stringData, _ := d["stringData"].(map[string]any)
				for k, v := range stringData {
					kv[k] = str(v) // stringData wins, as in the API server
				}
				s.secrets[o.name()] = kv
			case "ConfigMap":
				kv := map[string]string{}
				m, _ := d["data"].(map[string]any)
				for k, v := range m {
					kv[k] = str(v)
				}
				s.configMaps[o.name()] = kv
			}
		}
	}
	for _, o := range s.objects {
		var pod any
		switch o.kind() {
		case "Deployment", "StatefulSet", "DaemonSet", "Job":
			pod = get(o.doc, "spec", "template", "spec")
		case "CronJob":
			pod = get(o.doc, "spec", "jobTemplate", "spec", "template", "spec")
		default:
			continue
		}
		cs, err := podContainers(o, pod, s)
		if err != nil {
			return s, err
		}
		s.containers = append(s.containers, cs...)
	}
	return s, nil
}

func podContainers(o k8sObject, pod any, s k8sSet) ([]container, error) {
	grace := 30 * time.Second // Kubernetes' default
	if g := get(pod, "terminationGracePeriodSeconds"); g != nil {
		n, err := strconv.Atoi(str(g))
		if err != nil {
			return nil, fmt.Errorf("%s: terminationGracePeriodSeconds: %w", o.where(), err)
		}
		grace = time.Duration(n) * time.Second
	}
	volumes := map[string]any{}
	for _, v := range list(get(pod, "volumes")) {
		volumes[str(get(v, "name"))] = v
	}
	podSec, _ := get(pod, "securityContext").(map[string]any)
	var out []container
	for _, field := range []string{"initContainers", "containers"} {
		for _, raw := range list(get(pod, field)) {
			c := container{
				where:     fmt.Sprintf("%s container %s", o.where(), str(get(raw, "name"))),
				owner:     o.kind() + "/" + o.name(),
				image:     str(get(raw, "image")),
				command:   append(strs(get(raw, "command")), strs(get(raw, "args"))...),
				env:       map[string]string{},
				ports:     map[string]int{},
				files:     map[string]string{},
				stopGrace: grace,
				security:  map[string]any{},
				k8s:       true,
			}
			for k, v := range podSec {
				c.security[k] = v
			}
			if cs, ok := get(raw, "securityContext").(map[string]any); ok {
				for k, v := range cs {
					c.security[k] = v
				}
			}
			for _, e := range list(get(raw, "env")) {
				c.env[str(get(e, "name"))] = str(get(e, "value"))
			}
			for _, e := range list(get(raw, "envFrom")) {
				for _, kind := range []string{"secretRef", "configMapRef"} {
					if n := str(get(e, kind, "name")); n != "" {
						c.envFrom = append(c.envFrom, n)
					}
				}
			}
			for _, p := range list(get(raw, "ports")) {
				n, err := strconv.Atoi(str(get(p, "containerPort")))
				if err != nil {
					return nil, fmt.Errorf("%s: containerPort: %w", c.where, err)
				}
				c.ports[strconv.Itoa(n)] = n
				if name := str(get(p, "name")); name != "" {
					c.ports[name] = n
				}
			}
			for _, kind := range []string{"startupProbe", "livenessProbe", "readinessProbe"} {
				if hg := get(raw, kind, "httpGet"); hg != nil {
					c.probes = append(c.probes, probe{what: kind, port: str(get(hg, "port")), path: str(get(hg, "path"))})
				}
			}
			for _, m := range list(get(raw, "volumeMounts")) {
				mountPath := strings.TrimSuffix(str(get(m, "mountPath")), "/")
				vol, ok := volumes[str(get(m, "name"))]
				if !ok {
					c.mountErrs = append(c.mountErrs, fmt.Errorf("%s: volumeMount %s names no volume", c.where, str(get(m, "name"))))
					continue
				}
				var source map[string]string
				var known bool
				if n := str(get(vol, "configMap", "name")); n != "" {
					source, known = s.configMaps[n]
					if !known {
						c.mountErrs = append(c.mountErrs, fmt.Errorf("%s: volume %s: ConfigMap %s not in the manifests", c.where, str(get(vol, "name")), n))
					}
				} else if n := str(get(vol, "secret", "secretName")); n != "" {
					source, known = s.secrets[n]
					if !known {
						c.mountErrs = append(c.mountErrs, fmt.Errorf("%s: volume %s: Secret %s not in the manifests", c.where, str(get(vol, "name")), n))
					}
				}
				if sub := str(get(m, "subPath")); sub != "" {
					if v, ok := source[sub]; ok {
						c.files[mountPath] = v
					}
					continue
				}
				c.files[mountPath+"/"] = ""
				for k, v := range source {
					c.files[mountPath+"/"+k] = v
				}
			}
			out = append(out, c)
		}
	}
	return out, nil
}
