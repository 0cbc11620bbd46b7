package check

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/llmq/llmq/internal/config"
)

// lanes are the suffixes of the jobs queues and topics (docs/design.md#names).
var lanes = []string{"high", "normal", "low"}

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
			// The workers' backlog waits on the internal lanes, once the
			// ingester has stored what producers published to llmq.jobs.
			lane, isLane := strings.CutPrefix(name, "llmq.lane.")
			if !isLane || !slices.Contains(lanes, lane) {
				bad("%s trigger on %s %q, not a lane llmq.lane.<high|normal|low>", typ, field, name)
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

// checkKafkaGroups: KEDA's kafka triggers watch the lag of the consumer
// group the Kafka driver's workers really join on that lane topic:
// <GroupID>.lane.<lane>, where GroupID is a string literal of its source.
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
			g := str(get(t, "metadata", "consumerGroup"))
			lane := strings.TrimPrefix(str(get(t, "metadata", "topic")), "llmq.lane.")
			id, ok := strings.CutSuffix(g, ".lane."+lane)
			if !ok || !driverLiterals[id] || !driverLiterals[".lane."] {
				errs = append(errs, fmt.Errorf("%s: consumerGroup %q is not the group internal/broker/kafka's workers join on lane %s", o.where(), g, lane))
			}
		}
	}
	return errs
}
