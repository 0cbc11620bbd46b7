package deploycheck

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"io/fs"
	"math"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/llmq/llmq/internal/config"
)

const modulePath = "github.com/llmq/llmq"

// lanes are the queue/topic suffixes of design.md §1.
var lanes = []string{"high", "normal", "low"}

// dockerBuild is what the Dockerfile builds.
type dockerBuild struct {
	binaries map[string]string // binary name → package ("./cmd/producer")
	final    map[string]bool   // binaries copied into the final stage
}

var (
	buildOutput = regexp.MustCompile(`-o\s+(\S+)\s+(\./\S+)`)
	fromLine    = regexp.MustCompile(`(?im)^FROM\s`)
)

func parseDockerfile(text string) (dockerBuild, error) {
	b := dockerBuild{binaries: map[string]string{}, final: map[string]bool{}}
	for _, m := range buildOutput.FindAllStringSubmatch(text, -1) {
		b.binaries[path.Base(m[1])] = m[2]
	}
	if len(b.binaries) == 0 {
		return b, fmt.Errorf("Dockerfile: no `go build -o /out/NAME ./PKG` found")
	}
	idx := fromLine.FindAllStringIndex(text, -1)
	if len(idx) < 2 {
		return b, fmt.Errorf("Dockerfile: want a multi-stage build, found %d FROM", len(idx))
	}
	for _, line := range strings.Split(text[idx[len(idx)-1][0]:], "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.EqualFold(f[0], "COPY") {
			continue
		}
		for _, src := range f[1 : len(f)-1] {
			if !strings.HasPrefix(src, "--") {
				b.final[path.Base(src)] = true
			}
		}
	}
	return b, nil
}

// checkDockerfile: every binary is built from an existing package and
// copied into the final image; cmd/<name> builds binary <name>.
func checkDockerfile(b dockerBuild, root string) []error {
	var errs []error
	for name, pkg := range b.binaries {
		if fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(pkg))); err != nil || !fi.IsDir() {
			errs = append(errs, fmt.Errorf("Dockerfile builds %s from %s, which is not a directory", name, pkg))
		}
		if strings.HasPrefix(pkg, "./cmd/") && path.Base(pkg) != name {
			errs = append(errs, fmt.Errorf("Dockerfile builds %s from %s: binary and cmd/ directory names differ", name, pkg))
		}
		if !b.final[name] {
			errs = append(errs, fmt.Errorf("Dockerfile builds %s but does not copy it into the final stage", name))
		}
	}
	return errs
}

// imageRepo is an image reference without tag or digest.
func imageRepo(image string) string {
	image, _, _ = strings.Cut(image, "@")
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

// checkImages: a container that runs an llmq binary (or uses llmq's image)
// uses the image the Dockerfile builds, and its command names a binary the
// Dockerfile builds from an existing cmd/<name>.
func checkImages(cs []container, repo string, b dockerBuild, root string) []error {
	var errs []error
	for _, c := range cs {
		bin := c.binary()
		_, built := b.binaries[bin]
		cmdDir := false
		if bin != "" {
			fi, err := os.Stat(filepath.Join(root, "cmd", bin))
			cmdDir = err == nil && fi.IsDir()
		}
		ours := imageRepo(c.image) == repo
		if !ours && !built && !cmdDir {
			continue // postgres, rabbitmq, …
		}
		switch {
		case !ours:
			errs = append(errs, fmt.Errorf("%s: runs llmq binary %q from image %q, not %s", c.where, bin, c.image, repo))
		case len(c.command) == 0:
			errs = append(errs, fmt.Errorf("%s: image %s needs a command naming its binary", c.where, c.image))
		case !built:
			errs = append(errs, fmt.Errorf("%s: command %q names no binary the Dockerfile builds", c.where, c.command[0]))
		case !cmdDir && strings.HasPrefix(b.binaries[bin], "./cmd/"):
			errs = append(errs, fmt.Errorf("%s: command %q has no cmd/%s directory", c.where, c.command[0], bin))
		case !strings.HasPrefix(b.binaries[bin], "./cmd/"):
			errs = append(errs, fmt.Errorf("%s: command %q is a helper (%s), not a cmd/ binary", c.where, c.command[0], b.binaries[bin]))
		}
	}
	return errs
}

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

// serveAddr is the address the container's binary listens on, from the
// same configuration the binary reads; "" for binaries that serve nothing.
func serveAddr(c container, secrets map[string]map[string]string) (string, error) {
	switch c.binary() {
	case "producer", "consumer":
		cfg, err := containerConfig(c, secrets)
		if err != nil {
			return "", err
		}
		if c.binary() == "producer" {
			if !isLoopback(cfg.HTTPAddr) && len(cfg.APIKeys) == 0 {
				return "", fmt.Errorf("%s: producer on %s has no LLMQ_API_KEYS: a non-loopback producer requires keys", c.where, cfg.HTTPAddr)
			}
			return cfg.HTTPAddr, nil
		}
		return cfg.MetricsAddr, nil
	case "llmsim":
		if a := flagValue(c.command, "--addr"); a != "" {
			return a, nil
		}
		return "", fmt.Errorf("%s: llmsim without --addr", c.where)
	}
	return "", nil
}

func isLoopback(addr string) bool {
	host, _, _ := net.SplitHostPort(addr)
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkProbes: every probe and healthcheck hits a route the binary serves
// on the port it listens on, and the binary listens on a reachable address.
// served maps a binary to the routes found in its source.
func checkProbes(cs []container, secrets map[string]map[string]string, served map[string]map[string]bool) []error {
	var errs []error
	for _, c := range cs {
		addr, err := serveAddr(c, secrets)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if addr == "" {
			continue
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: address %q: %w", c.where, addr, err))
			continue
		}
		if isLoopback(addr) {
			errs = append(errs, fmt.Errorf("%s: %s listens on loopback %s: probes, Services and Prometheus cannot reach it", c.where, c.binary(), addr))
		}
		if c.k8s {
			if n, _ := strconv.Atoi(port); !slices.Contains(mapValues(c.ports), n) {
				errs = append(errs, fmt.Errorf("%s: %s listens on %s but declares no containerPort %s", c.where, c.binary(), addr, port))
			}
		}
		if len(c.probes) == 0 {
			errs = append(errs, fmt.Errorf("%s: %s has no health probe", c.where, c.binary()))
		}
		for _, p := range c.probes {
			got := p.port
			if n, ok := c.ports[p.port]; ok {
				got = strconv.Itoa(n)
			}
			if got != port {
				errs = append(errs, fmt.Errorf("%s: %s port %s, but %s listens on %s", c.where, p.what, p.port, c.binary(), addr))
			}
			if p.host != "" && !isLoopback(net.JoinHostPort(p.host, p.port)) {
				errs = append(errs, fmt.Errorf("%s: %s runs inside the container and should use 127.0.0.1, not %s", c.where, p.what, p.host))
			}
			if !served[c.binary()][p.path] {
				errs = append(errs, fmt.Errorf("%s: %s path %s is not a route %s serves", c.where, p.what, p.path, c.binary()))
			}
		}
	}
	return errs
}

func mapValues(m map[string]int) []int {
	out := make([]int, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// checkScrape: Prometheus static targets that are compose services running
// llmq binaries use the port the binary listens on and a route it serves.
func checkScrape(prom doc, cf composeFile, secrets map[string]map[string]string, served map[string]map[string]bool) []error {
	byService := map[string]container{}
	for _, c := range cf.containers {
		byService[c.owner] = c
	}
	var errs []error
	for _, sc := range list(prom["scrape_configs"]) {
		job := str(get(sc, "job_name"))
		metricsPath := str(get(sc, "metrics_path"))
		if metricsPath == "" {
			metricsPath = "/metrics"
		}
		for _, st := range list(get(sc, "static_configs")) {
			for _, t := range strs(get(st, "targets")) {
				host, port, err := net.SplitHostPort(t)
				if err != nil {
					errs = append(errs, fmt.Errorf("prometheus job %s: target %q: %w", job, t, err))
					continue
				}
				c, ok := byService[host]
				if !ok {
					errs = append(errs, fmt.Errorf("prometheus job %s: target %s is no docker-compose service", job, t))
					continue
				}
				addr, err := serveAddr(c, secrets)
				if err != nil || addr == "" {
					continue // reported by checkProbes, or not an llmq binary
				}
				if _, p, _ := net.SplitHostPort(addr); p != port {
					errs = append(errs, fmt.Errorf("prometheus job %s: target %s, but %s listens on %s", job, t, c.binary(), addr))
				}
				if !served[c.binary()][metricsPath] {
					errs = append(errs, fmt.Errorf("prometheus job %s: %s does not serve %s", job, c.binary(), metricsPath))
				}
			}
		}
	}
	return errs
}

// servedRoutes collects the route-like string literals ("/healthz",
// "GET /readyz") of cmd/<binary> and every package of this module it
// imports, transitively: the paths the binary can serve.
func servedRoutes(root, binary string) (map[string]bool, error) {
	routes := map[string]bool{}
	seen := map[string]bool{}
	queue := []string{"cmd/" + binary}
	for len(queue) > 0 {
		dir := queue[0]
		queue = queue[1:]
		if seen[dir] {
			continue
		}
		seen[dir] = true
		files, err := goFiles(filepath.Join(root, dir))
		if err != nil {
			return nil, err
		}
		if len(files) == 0 && dir == "cmd/"+binary {
			return nil, fmt.Errorf("cmd/%s has no Go files", binary)
		}
		fset := token.NewFileSet()
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				return nil, err
			}
			if af, err := parser.ParseFile(fset, f, src, parser.ImportsOnly); err == nil {
				for _, imp := range af.Imports {
					p, _ := strconv.Unquote(imp.Path.Value)
					if rel, ok := strings.CutPrefix(p, modulePath+"/"); ok {
						queue = append(queue, rel)
					}
				}
			}
			for _, lit := range stringLiterals(src) {
				if method, after, ok := strings.Cut(lit, " "); ok && isMethod(method) {
					lit = after
				}
				if strings.HasPrefix(lit, "/") && !strings.ContainsAny(lit, " %\n") {
					routes[lit] = true
				}
			}
		}
	}
	return routes, nil
}

func isMethod(s string) bool {
	switch s {
	case "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH":
		return true
	}
	return false
}

// goFiles lists the non-test Go files of one directory.
func goFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		if !e.IsDir() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			out = append(out, filepath.Join(dir, n))
		}
	}
	return out, nil
}

// stringLiterals returns the unquoted string literals of a Go source file,
// comments excluded; it tolerates files that do not compile yet.
func stringLiterals(src []byte) []string {
	var s scanner.Scanner
	fset := token.NewFileSet()
	file := fset.AddFile("", fset.Base(), len(src))
	s.Init(file, src, nil, 0)
	var out []string
	for {
		_, tok, lit := s.Scan()
		if tok == token.EOF {
			return out
		}
		if tok == token.STRING {
			if v, err := strconv.Unquote(lit); err == nil {
				out = append(out, v)
			}
		}
	}
}

var metricName = regexp.MustCompile(`[A-Za-z0-9_:]*llmq_[A-Za-z0-9_:]*`)

// codeMetricNames computes, from the source at test time, every llmq_
// metric name the code can register: string literals containing
// llmq_<name>, and prometheus Opts literals whose Namespace/Subsystem/Name
// fields join to llmq_<name>.
func codeMetricNames(root string, skip ...string) (map[string]bool, error) {
	names := map[string]bool{}
	for _, top := range []string{"internal", "cmd"} {
		if _, err := os.Stat(filepath.Join(root, top)); err != nil {
			continue
		}
		err := filepath.WalkDir(filepath.Join(root, top), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				for _, s := range skip {
					if p == filepath.Join(root, s) {
						return filepath.SkipDir
					}
				}
				return nil
			}
			if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, lit := range stringLiterals(src) {
				for _, m := range metricName.FindAllString(lit, -1) {
					if strings.HasPrefix(m, "llmq_") {
						names[m] = true
					}
				}
			}
			af, err := parser.ParseFile(token.NewFileSet(), p, src, 0)
			if err != nil {
				return nil // being written: its literals are counted above
			}
			ast.Inspect(af, func(n ast.Node) bool {
				cl, ok := n.(*ast.CompositeLit)
				if !ok {
					return true
				}
				parts := map[string]string{}
				for _, e := range cl.Elts {
					kv, ok := e.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					key, ok1 := kv.Key.(*ast.Ident)
					val, ok2 := kv.Value.(*ast.BasicLit)
					if ok1 && ok2 && val.Kind == token.STRING {
						parts[key.Name], _ = strconv.Unquote(val.Value)
					}
				}
				if parts["Name"] == "" {
					return true
				}
				var full []string
				for _, k := range []string{"Namespace", "Subsystem", "Name"} {
					if parts[k] != "" {
						full = append(full, parts[k])
					}
				}
				if n := strings.Join(full, "_"); strings.HasPrefix(n, "llmq_") {
					names[n] = true
				}
				return true
			})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return names, nil
}

// metricRefs finds the llmq_ metric names used anywhere in a decoded
// document (Grafana JSON, Prometheus rules): every string is searched.
func metricRefs(v any, out map[string]bool) {
	switch x := v.(type) {
	case string:
		for _, m := range metricName.FindAllString(x, -1) {
			if strings.HasPrefix(m, "llmq_") {
				out[m] = true
			}
		}
	case map[string]any:
		for _, e := range x {
			metricRefs(e, out)
		}
	case []any:
		for _, e := range x {
			metricRefs(e, out)
		}
	}
}

var seriesSuffixes = []string{"_bucket", "_sum", "_count", "_total"}

// checkMetrics: every referenced name exists in code, or is a code name
// plus a series suffix (histogram/summary series, counters declared
// without _total).
func checkMetrics(where string, refs, known map[string]bool) []error {
	var errs []error
	for _, ref := range sortedKeys(refs) {
		if known[ref] {
			continue
		}
		ok := false
		for _, s := range seriesSuffixes {
			if base, cut := strings.CutSuffix(ref, s); cut && known[base] {
				ok = true
			}
		}
		if !ok {
			errs = append(errs, fmt.Errorf("%s: metric %s is not registered anywhere in internal/ or cmd/", where, ref))
		}
	}
	return errs
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func decodeJSON(data []byte) (any, error) {
	var v any
	err := json.Unmarshal(data, &v)
	return v, err
}

// replicaBound is the most consumer replicas the quota can feed:
//
//	slots_m = min(rpm_m, tpm_m / tokensPerRequest) / 60 × latencySeconds
//	bound   = max over models m of ceil(slots_m / max_concurrency_m)
//
// (Little's law: requests per second × seconds per request = requests in
// flight; one replica holds at most max_concurrency_m of them.) A model
// without rpm and tpm, or without max_concurrency, leaves it undefined.
func replicaBound(cfg config.Config, latencySeconds, tokensPerRequest float64) (int, error) {
	if len(cfg.Models) == 0 {
		return 0, fmt.Errorf("no models: the replica bound needs their quotas")
	}
	bound := 0
	for _, name := range sortedKeys(cfg.Models) {
		m := cfg.Models[name]
		rate := math.Inf(1)
		if m.RPM > 0 {
			rate = m.RPM
		}
		if m.TPM > 0 {
			rate = math.Min(rate, m.TPM/tokensPerRequest)
		}
		if math.IsInf(rate, 1) {
			return 0, fmt.Errorf("models.%s has neither rpm nor tpm: the replica bound is undefined", name)
		}
		if m.MaxConcurrency <= 0 {
			return 0, fmt.Errorf("models.%s has no max_concurrency: the replica bound is undefined", name)
		}
		need := int(math.Ceil(rate / 60 * latencySeconds / float64(m.MaxConcurrency)))
		bound = max(bound, need)
	}
	return max(bound, 1), nil
}

const (
	annotationLatency = "llmq.io/typical-latency-seconds"
	annotationTokens  = "llmq.io/typical-tokens-per-request"
)

// checkKEDA: every ScaledObject targets a Deployment in the manifests,
// scales on all three lanes, authenticates through a TriggerAuthentication
// whose Secret keys exist, and keeps maxReplicaCount within the bound the
// target's quotas allow (replicaBound, with the latency and request size
// stated in its annotations).
func checkKEDA(objs []k8sObject, containers []container, secrets map[string]map[string]string) []error {
	var errs []error
	byKind := map[string]map[string]k8sObject{}
	for _, o := range objs {
		if byKind[o.kind()] == nil {
			byKind[o.kind()] = map[string]k8sObject{}
		}
		byKind[o.kind()][o.name()] = o
	}
	for _, ta := range byKind["TriggerAuthentication"] {
		for _, ref := range list(get(ta.doc, "spec", "secretTargetRef")) {
			name, key := str(get(ref, "name")), str(get(ref, "key"))
			if _, ok := secrets[name][key]; !ok {
				errs = append(errs, fmt.Errorf("%s: Secret %s has no key %q", ta.where(), name, key))
			}
		}
	}
	for _, o := range objs {
		if o.kind() != "ScaledObject" {
			continue
		}
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s", o.where(), fmt.Sprintf(format, args...)))
		}
		target := str(get(o.doc, "spec", "scaleTargetRef", "name"))
		if kind := str(get(o.doc, "spec", "scaleTargetRef", "kind")); kind != "" && kind != "Deployment" {
			bad("scaleTargetRef kind %s: only Deployments are checked", kind)
			continue
		}
		if _, ok := byKind["Deployment"][target]; !ok {
			bad("scaleTargetRef %q is no Deployment in the manifests", target)
			continue
		}
		covered := map[string]map[string]bool{}
		for _, t := range list(get(o.doc, "spec", "triggers")) {
			typ := str(get(t, "type"))
			field, ok := map[string]string{"rabbitmq": "queueName", "kafka": "topic"}[typ]
			if !ok {
				continue
			}
			name := str(get(t, "metadata", field))
			lane, isLane := strings.CutPrefix(name, "llmq.jobs.")
			if !isLane || !slices.Contains(lanes, lane) {
				bad("%s trigger on %s %q, not a lane llmq.jobs.<high|normal|low>", typ, field, name)
			}
			if typ == "kafka" && str(get(t, "metadata", "consumerGroup")) == "" {
				bad("kafka trigger on %s has no consumerGroup", name)
			}
			if covered[typ] == nil {
				covered[typ] = map[string]bool{}
			}
			covered[typ][lane] = true
			if auth := str(get(t, "authenticationRef", "name")); auth == "" {
				bad("%s trigger without authenticationRef: broker credentials belong in a TriggerAuthentication", typ)
			} else if _, ok := byKind["TriggerAuthentication"][auth]; !ok {
				bad("authenticationRef %q is no TriggerAuthentication in the manifests", auth)
			}
		}
		if len(covered) == 0 {
			bad("no rabbitmq or kafka trigger")
		}
		for typ, got := range covered {
			for _, l := range lanes {
				if !got[l] {
					bad("no %s trigger for lane %s", typ, l)
				}
			}
		}
		latency, err1 := strconv.ParseFloat(str(get(o.doc, "metadata", "annotations", annotationLatency)), 64)
		tokens, err2 := strconv.ParseFloat(str(get(o.doc, "metadata", "annotations", annotationTokens)), 64)
		if err1 != nil || err2 != nil || latency <= 0 || tokens <= 0 {
			bad("annotations %s and %s must state the assumptions of maxReplicaCount", annotationLatency, annotationTokens)
			continue
		}
		var cfg *config.Config
		for _, c := range containers {
			if c.owner == "Deployment/"+target && c.binary() == "consumer" {
				got, err := containerConfig(c, secrets)
				if err != nil {
					errs = append(errs, err)
					break
				}
				cfg = &got
			}
		}
		if cfg == nil {
			bad("target %s runs no consumer whose configuration loads", target)
			continue
		}
		bound, err := replicaBound(*cfg, latency, tokens)
		if err != nil {
			bad("%v", err)
			continue
		}
		maxRep, err := strconv.Atoi(str(get(o.doc, "spec", "maxReplicaCount")))
		if err != nil {
			bad("maxReplicaCount must be set (KEDA's default 100 ignores the quota)")
			continue
		}
		minRep, _ := strconv.Atoi(str(get(o.doc, "spec", "minReplicaCount")))
		if maxRep > bound {
			bad("maxReplicaCount %d exceeds %d, the most replicas the models' quotas can feed", maxRep, bound)
		}
		if minRep > maxRep {
			bad("minReplicaCount %d above maxReplicaCount %d", minRep, maxRep)
		}
	}
	return errs
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

// checkSecurity: Kubernetes containers run as non-root on a read-only root
// filesystem with no capabilities, no privilege escalation and the
// runtime's seccomp profile.
func checkSecurity(cs []container) []error {
	var errs []error
	for _, c := range cs {
		if !c.k8s {
			continue
		}
		s := c.security
		want := func(ok bool, what string) {
			if !ok {
				errs = append(errs, fmt.Errorf("%s: securityContext needs %s", c.where, what))
			}
		}
		want(s["runAsNonRoot"] == true, "runAsNonRoot: true")
		want(s["readOnlyRootFilesystem"] == true, "readOnlyRootFilesystem: true")
		want(s["allowPrivilegeEscalation"] == false, "allowPrivilegeEscalation: false")
		want(slices.Contains(strs(get(s, "capabilities", "drop")), "ALL"), "capabilities.drop: [ALL]")
		want(str(get(s, "seccompProfile", "type")) == "RuntimeDefault", "seccompProfile.type: RuntimeDefault")
	}
	return errs
}

// checkKustomization: resources exist, and the image override names the
// image the Dockerfile builds.
func checkKustomization(k doc, dir, repo string) []error {
	var errs []error
	for _, r := range strs(k["resources"]) {
		if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(r))); err != nil {
			errs = append(errs, fmt.Errorf("kustomization: resource %s: %w", r, err))
		}
	}
	for _, img := range list(k["images"]) {
		if n := str(get(img, "name")); n != repo {
			errs = append(errs, fmt.Errorf("kustomization: image override %s, but the Dockerfile's image is %s", n, repo))
		}
	}
	return errs
}

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

// checkKafkaGroups: KEDA's kafka triggers watch the lag of a consumer group
// the Kafka driver really joins: a string literal of its source.
func checkKafkaGroups(objs []k8sObject, driverLiterals map[string]bool) []error {
	var errs []error
	for _, o := range objs {
		if o.kind() != "ScaledObject" {
			continue
		}
		for _, t := range list(get(o.doc, "spec", "triggers")) {
			if str(get(t, "type")) != "kafka" {
				continue
			}
			if g := str(get(t, "metadata", "consumerGroup")); !driverLiterals[g] {
				errs = append(errs, fmt.Errorf("%s: consumerGroup %q is not a group name in internal/broker/kafka", o.where(), g))
			}
		}
	}
	return errs
}

// packageLiterals is every string literal of a package's non-test files.
func packageLiterals(dir string) (map[string]bool, error) {
	files, err := goFiles(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, l := range stringLiterals(src) {
			out[l] = true
		}
	}
	return out, nil
}
