package check

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

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

var metricName = regexp.MustCompile(`[A-Za-z0-9_:]*llmq_[A-Za-z0-9_:]*`)

// codeMetricNames computes, from the source at test time, every llmq_
// metric name the code can register: string literals containing
// llmq_<name>, and prometheus Opts literals whose Namespace/Subsystem/Name
// fields join to llmq_<name>.
func codeMetricNames(root string) (map[string]bool, error) {
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

func decodeJSON(data []byte) (any, error) {
	var v any
	err := json.Unmarshal(data, &v)
	return v, err
}
