package check

import (
	"fmt"
	"go/parser"
	"go/token"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

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
