package check

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"testing"

	"github.com/llmq/llmq/internal/config"
)

// policy is one NetworkPolicy: the labels it selects and the TCP/UDP ports
// its rules allow (nil: the direction is not restricted by it).
type policy struct {
	name            string
	selector        map[string]string
	ingress, egress []int
	// ingressAll and egressAll: a rule without ports allows every port.
	ingressAll, egressAll bool
	restricts             map[string]bool // "Ingress", "Egress"
}

func policiesOf(s k8sSet) []policy {
	var out []policy
	for _, o := range s.objects {
		if o.kind() != "NetworkPolicy" {
			continue
		}
		p := policy{name: o.name(), selector: map[string]string{}, restricts: map[string]bool{}}
		if m, ok := get(o.doc, "spec", "podSelector", "matchLabels").(map[string]any); ok {
			for k, v := range m {
				p.selector[k] = str(v)
			}
		}
		for _, t := range strs(get(o.doc, "spec", "policyTypes")) {
			p.restricts[t] = true
		}
		for dir, rules := range map[string][]any{"ingress": list(get(o.doc, "spec", "ingress")), "egress": list(get(o.doc, "spec", "egress"))} {
			for _, r := range rules {
				ports := list(get(r, "ports"))
				if len(ports) == 0 {
					if dir == "ingress" {
						p.ingressAll = true
					} else {
						p.egressAll = true
					}
				}
				for _, port := range ports {
					n, _ := strconv.Atoi(str(get(port, "port")))
					if dir == "ingress" {
						p.ingress = append(p.ingress, n)
					} else {
						p.egress = append(p.egress, n)
					}
				}
			}
		}
		out = append(out, p)
	}
	return out
}

func (p policy) selects(labels map[string]string) bool {
	for k, v := range p.selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// portOf is the port of a URL, or def for its scheme.
func portOf(raw string, defs map[string]int) int {
	u, err := url.Parse(raw)
	if err != nil {
		return 0
	}
	if p := u.Port(); p != "" {
		n, _ := strconv.Atoi(p)
		return n
	}
	return defs[u.Scheme]
}

// neededEgress is what an llmq container connects to: DNS, Postgres, the
// broker and, for consumers, the provider.
func neededEgress(c container, cfg config.Config) map[int]string {
	need := map[int]string{53: "DNS", portOf(cfg.PostgresURL, map[string]int{"postgres": 5432, "postgresql": 5432}): "postgres_url"}
	if cfg.Broker == "kafka" {
		for _, b := range cfg.KafkaBrokers {
			if _, p, err := net.SplitHostPort(b); err == nil {
				n, _ := strconv.Atoi(p)
				need[n] = "kafka_brokers"
			}
		}
	} else {
		need[portOf(cfg.AMQPURL.Reveal(), map[string]int{"amqp": 5672, "amqps": 5671})] = "amqp_url"
	}
	if c.binary() == "consumer" && cfg.Provider.BaseURL != "" {
		need[portOf(cfg.Provider.BaseURL, map[string]int{"http": 80, "https": 443})] = "provider.base_url"
	}
	delete(need, 0)
	return need
}

// checkNetworkPolicies: every llmq Deployment is selected by a policy; a
// policy's ingress ports are ports its pods expose and include the port
// llmq serves; egress allows what the pod's configuration connects to.
func checkNetworkPolicies(s k8sSet, sources map[string]map[string]string) []error {
	var errs []error
	policies := policiesOf(s)
	for _, o := range s.objects {
		if o.kind() != "Deployment" {
			continue
		}
		labels := map[string]string{}
		if m, ok := get(o.doc, "spec", "template", "metadata", "labels").(map[string]any); ok {
			for k, v := range m {
				labels[k] = str(v)
			}
		}
		var cs []container
		for _, c := range s.containers {
			if c.owner == "Deployment/"+o.name() && (c.binary() == "producer" || c.binary() == "consumer") {
				cs = append(cs, c)
			}
		}
		if len(cs) == 0 {
			continue
		}
		var sel []policy
		for _, p := range policies {
			if p.selects(labels) {
				sel = append(sel, p)
			}
		}
		if len(sel) == 0 {
			errs = append(errs, fmt.Errorf("%s: no NetworkPolicy selects its pods", o.where()))
			continue
		}
		allowed := func(dir string, port int) bool {
			restricted := false
			for _, p := range sel {
				if !p.restricts[dir] {
					continue
				}
				restricted = true
				all, ports := p.ingressAll, p.ingress
				if dir == "Egress" {
					all, ports = p.egressAll, p.egress
				}
				if all || slices.Contains(ports, port) {
					return true
				}
			}
			return !restricted
		}
		for _, c := range cs {
			exposed := mapValues(c.ports)
			for _, p := range sel {
				for _, port := range p.ingress {
					if !slices.Contains(exposed, port) {
						errs = append(errs, fmt.Errorf("NetworkPolicy %s allows ingress on %d, which %s does not expose", p.name, port, c.where))
					}
				}
			}
			cfg, err := containerConfig(c, sources)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			addr := cfg.HTTPAddr
			if c.binary() == "consumer" {
				addr = cfg.MetricsAddr
			}
			if _, p, err := net.SplitHostPort(addr); err == nil {
				if n, _ := strconv.Atoi(p); !allowed("Ingress", n) {
					errs = append(errs, fmt.Errorf("%s serves on %s, but no NetworkPolicy allows ingress to it", c.where, addr))
				}
			}
			for port, what := range neededEgress(c, cfg) {
				if !allowed("Egress", port) {
					errs = append(errs, fmt.Errorf("%s connects to port %d (%s), but no NetworkPolicy allows egress to it", c.where, port, what))
				}
			}
		}
	}
	return errs
}

func TestNetworkPolicies(t *testing.T) {
	r := loadRepo(t)
	report(t, checkNetworkPolicies(r.k8s, r.sources))
}

func TestCheckNetworkPoliciesFails(t *testing.T) {
	const deployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: c}
spec:
  template:
    metadata: {labels: {app: c}}
    spec:
      containers:
        - name: c
          image: i
          command: [consumer, run]
          env:
            - {name: LLMQ_METRICS_ADDR, value: "0.0.0.0:9100"}
            - {name: LLMQ_POSTGRES_URL, value: "postgres://db:5433/x"}
            - {name: LLMQ_PROVIDER_BASE_URL, value: "https://provider/v1"}
          ports: [{name: metrics, containerPort: 9100}]
`
	requireErr(t, checkNetworkPolicies(k8s(t, deployment), nil), "no NetworkPolicy selects its pods")
	s := k8s(t, deployment+`---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p}
spec:
  podSelector: {matchLabels: {app: c}}
  policyTypes: [Ingress, Egress]
  ingress: [{ports: [{port: 8080}]}]
  egress: [{ports: [{port: 53}, {port: 5432}, {port: 5672}]}]
`)
	errs := checkNetworkPolicies(s, nil)
	requireErr(t, errs, "allows ingress on 8080, which m.yaml Deployment/c container c does not expose")
	requireErr(t, errs, "serves on 0.0.0.0:9100, but no NetworkPolicy allows ingress to it")
	requireErr(t, errs, "connects to port 5433 (postgres_url)")
	requireErr(t, errs, "connects to port 443 (provider.base_url)")
}
