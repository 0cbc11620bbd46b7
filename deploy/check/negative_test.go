package check

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/llmq/llmq/internal/config"
)

// Each checker is fed a small broken snippet and must report it; a checker
// that cannot fail proves nothing.

// fakeRoot is a repository with cmd/producer, cmd/consumer and a config file.
func fakeRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"cmd/producer", "cmd/consumer", "deploy"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(root, "deploy", "llmq.yaml"), []byte("models:\n  m:\n    rpm: 60\n    max_concurrency: 1\n"), 0o644))
	return root
}

const goodDockerfile = `FROM golang:1.26 AS build
RUN go build -o /out/producer ./cmd/producer && go build -o /out/consumer ./cmd/consumer
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/producer /out/consumer /usr/local/bin/
`

func compose(t *testing.T, root, text string) composeFile {
	t.Helper()
	cf, err := loadCompose(root, "compose.yml", []byte(text))
	require.NoError(t, err)
	return cf
}

func k8s(t *testing.T, text string) k8sSet {
	t.Helper()
	s, err := loadK8s(map[string][]byte{"m.yaml": []byte(text)})
	require.NoError(t, err)
	return s
}

func requireErr(t *testing.T, errs []error, want string) {
	t.Helper()
	require.NotEmpty(t, errs, "expected an error containing %q", want)
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	require.Contains(t, strings.Join(all, "\n"), want)
}

func TestCheckDockerfileFails(t *testing.T) {
	root := fakeRoot(t)
	b, err := parseDockerfile(goodDockerfile)
	require.NoError(t, err)
	require.Empty(t, checkDockerfile(b, root))

	b, err = parseDockerfile(strings.Replace(goodDockerfile, "/out/consumer /usr", "/usr", 1))
	require.NoError(t, err)
	requireErr(t, checkDockerfile(b, root), "does not copy it into the final stage")

	b, err = parseDockerfile(strings.Replace(goodDockerfile, "./cmd/consumer", "./cmd/worker", 1))
	require.NoError(t, err)
	requireErr(t, checkDockerfile(b, root), "not a directory")

	_, err = parseDockerfile("FROM scratch\n")
	require.Error(t, err)
}

func TestCheckImagesFails(t *testing.T) {
	root := fakeRoot(t)
	b, err := parseDockerfile(goodDockerfile)
	require.NoError(t, err)
	for _, tc := range []struct{ snippet, want string }{
		{"image: other/llmq:dev\n    command: [producer, serve]", "not ghcr.io/llmq/llmq"},
		{"image: ghcr.io/llmq/llmq:dev\n    command: [llmsim]", "names no binary the Dockerfile builds"},
		{"image: ghcr.io/llmq/llmq:dev", "needs a command"},
	} {
		cf := compose(t, root, "services:\n  x:\n    "+tc.snippet+"\n")
		requireErr(t, checkImages(cf.containers, "ghcr.io/llmq/llmq", b, root), tc.want)
	}
	cf := compose(t, root, "services:\n  x:\n    image: ghcr.io/llmq/llmq:1.0\n    command: [consumer, run]\n  db:\n    image: postgres:16\n")
	require.Empty(t, checkImages(cf.containers, "ghcr.io/llmq/llmq", b, root))
}

func TestCheckEnvFails(t *testing.T) {
	root := fakeRoot(t)
	cf := compose(t, root, "services:\n  x:\n    image: i\n    environment:\n      LLMQ_HTTP_ADR: 0.0.0.0:8080\n")
	requireErr(t, checkEnv(cf.containers, knownEnv(), nil), "LLMQ_HTTP_ADR is not in the configuration contract")

	s := k8s(t, `apiVersion: v1
kind: Secret
metadata: {name: s}
stringData: {LLMQ_POSTGRES_URI: x}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  template:
    spec:
      containers:
        - name: c
          image: i
          envFrom: [{secretRef: {name: s}}, {secretRef: {name: missing}}]
`)
	errs := checkEnv(s.containers, knownEnv(), s.secrets)
	requireErr(t, errs, "key LLMQ_POSTGRES_URI is not an LLMQ_* variable")
	requireErr(t, errs, "envFrom missing is not in the manifests")
}

func TestCheckConfigsFails(t *testing.T) {
	root := fakeRoot(t)
	require.NoError(t, os.WriteFile(filepath.Join(root, "deploy", "bad.yaml"), []byte("models:\n  m:\n    rpn: 60\n"), 0o644))
	cf := compose(t, root, `services:
  a:
    image: i
    command: [consumer, run]
    environment: {LLMQ_CONFIG: /etc/llmq/llmq.yaml}
    volumes: ["./deploy/bad.yaml:/etc/llmq/llmq.yaml:ro"]
  b:
    image: i
    command: [consumer, run]
    environment: {LLMQ_CONFIG: /etc/llmq/other.yaml}
    volumes: ["./deploy/llmq.yaml:/etc/llmq/llmq.yaml:ro", "./deploy/gone.yaml:/x.yaml"]
  c:
    image: i
    command: [producer, serve]
    environment: {LLMQ_BROKER: nats}
`)
	errs := checkConfigs(cf.containers, nil)
	requireErr(t, errs, "field rpn not found")
	requireErr(t, errs, "LLMQ_CONFIG /etc/llmq/other.yaml is not a file mounted")
	requireErr(t, errs, "volume ./deploy/gone.yaml")
	requireErr(t, errs, "broker: must be rabbitmq or kafka")

	s := k8s(t, `apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data:
  llmq.yaml: |
    provider: {api_key_file: /var/run/key/api-key}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  template:
    spec:
      volumes: [{name: cfg, configMap: {name: cfg}}]
      containers:
        - name: c
          image: i
          command: [consumer, run]
          env: [{name: LLMQ_CONFIG, value: /etc/llmq/llmq.yaml}]
          volumeMounts: [{name: cfg, mountPath: /etc/llmq}]
`)
	requireErr(t, checkConfigs(s.containers, s.secrets), "api_key_file /var/run/key/api-key is in no mounted volume")
}

func TestCheckProbesFails(t *testing.T) {
	root := fakeRoot(t)
	served := map[string]map[string]bool{"producer": {"/healthz": true, "/readyz": true, "/metrics": true}, "consumer": {"/healthz": true, "/metrics": true}}
	for _, tc := range []struct{ snippet, want string }{
		{"command: [producer, serve]\n    environment: {LLMQ_HTTP_ADDR: '0.0.0.0:8080', LLMQ_API_KEYS: 'key-0123456789abcdefgh:t'}\n    healthcheck: {test: [CMD, healthprobe, 'http://127.0.0.1:8081/readyz']}", "port 8081, but producer listens on 0.0.0.0:8080"},
		{"command: [producer, serve]\n    environment: {LLMQ_HTTP_ADDR: '0.0.0.0:8080', LLMQ_API_KEYS: 'key-0123456789abcdefgh:t'}\n    healthcheck: {test: [CMD, healthprobe, 'http://127.0.0.1:8080/health']}", "path /health is not a route producer serves"},
		{"command: [producer, serve]\n    environment: {LLMQ_HTTP_ADDR: '0.0.0.0:8080'}\n    healthcheck: {test: [CMD, healthprobe, 'http://127.0.0.1:8080/readyz']}", "has no LLMQ_API_KEYS"},
		{"command: [consumer, run]\n    healthcheck: {test: [CMD, healthprobe, 'http://127.0.0.1:9100/readyz']}", "listens on loopback 127.0.0.1:9100"},
		{"command: [consumer, run]\n    environment: {LLMQ_METRICS_ADDR: '0.0.0.0:9100'}", "has no health probe"},
	} {
		cf := compose(t, root, "services:\n  x:\n    image: i\n    "+tc.snippet+"\n")
		requireErr(t, checkProbes(cf.containers, nil, served), tc.want)
	}
	s := k8s(t, `apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  template:
    spec:
      containers:
        - name: c
          image: i
          command: [consumer, run]
          env: [{name: LLMQ_METRICS_ADDR, value: "0.0.0.0:9100"}]
          ports: [{name: http, containerPort: 8080}]
          livenessProbe: {httpGet: {path: /healthz, port: http}}
`)
	errs := checkProbes(s.containers, nil, served)
	requireErr(t, errs, "declares no containerPort 9100")
	requireErr(t, errs, "livenessProbe port http, but consumer listens on 0.0.0.0:9100")
}

func TestCheckScrapeFails(t *testing.T) {
	root := fakeRoot(t)
	cf := compose(t, root, "services:\n  consumer:\n    image: i\n    command: [consumer, run]\n    environment: {LLMQ_METRICS_ADDR: '0.0.0.0:9100'}\n")
	var prom doc
	require.NoError(t, yaml.Unmarshal([]byte(`scrape_configs:
  - job_name: c
    static_configs: [{targets: ["consumer:9090", "nowhere:1"]}]
`), &prom))
	errs := checkScrape(prom, cf, nil, map[string]map[string]bool{"consumer": {}})
	requireErr(t, errs, "target consumer:9090, but consumer listens on 0.0.0.0:9100")
	requireErr(t, errs, "consumer does not serve /metrics")
	requireErr(t, errs, "target nowhere:1 is no docker-compose service")
}

func TestCheckMetricsFails(t *testing.T) {
	var dash any
	require.NoError(t, yaml.Unmarshal([]byte(`{"panels":[{"targets":[
		{"expr":"sum(rate(llmq_jobs_total[5m])) / sum(rate(llmq_calls[5m]))"},
		{"expr":"histogram_quantile(0.9, rate(llmq_latency_seconds_bucket[5m]))"},
		{"expr":"llmq_made_up_metric"}]}]}`), &dash))
	refs := map[string]bool{}
	metricRefs(dash, refs)
	known := map[string]bool{"llmq_jobs": true, "llmq_calls": true, "llmq_latency_seconds": true}
	errs := checkMetrics("dash.json", refs, known)
	require.Len(t, errs, 1, "%v", errs)
	requireErr(t, errs, "metric llmq_made_up_metric is not registered")

	// The code side: literals and Opts with Namespace/Subsystem both count;
	// comments do not.
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "internal", "x"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "internal", "x", "m.go"), []byte(`package x
// llmq_in_a_comment is not a metric.
var a = "llmq_literal_total"
var b = Opts{Namespace: "llmq", Subsystem: "worker", Name: "in_flight"}
`), 0o644))
	names, err := codeMetricNames(root)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"llmq_literal_total": true, "llmq_worker_in_flight": true}, names)
}

const kedaManifests = `apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data:
  llmq.yaml: |
    models:
      a: {rpm: 600, max_concurrency: 20}
      b: {rpm: 6000, tpm: 600000, max_concurrency: 10}
---
apiVersion: v1
kind: Secret
metadata: {name: s}
stringData: {LLMQ_AMQP_URL: "amqp://u:p@h/"}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: consumer}
spec:
  template:
    spec:
      volumes: [{name: cfg, configMap: {name: cfg}}]
      containers:
        - name: c
          image: i
          command: [consumer, run]
          env: [{name: LLMQ_CONFIG, value: /etc/llmq/llmq.yaml}]
          volumeMounts: [{name: cfg, mountPath: /etc/llmq}]
---
apiVersion: keda.sh/v1alpha1
kind: TriggerAuthentication
metadata: {name: auth}
spec:
  secretTargetRef: [{parameter: host, name: s, key: LLMQ_AMQP_URL}]
---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: so
  annotations: {llmq.io/typical-latency-seconds: "10", llmq.io/typical-tokens-per-request: "1000"}
spec:
  scaleTargetRef: {name: consumer}
  maxReplicaCount: MAX
  triggers:
    - {type: rabbitmq, metadata: {queueName: llmq.lane.high}, authenticationRef: {name: auth}}
    - {type: rabbitmq, metadata: {queueName: llmq.lane.normal}, authenticationRef: {name: auth}}
    - {type: rabbitmq, metadata: {queueName: llmq.lane.low}, authenticationRef: {name: auth}}
`

func TestReplicaBound(t *testing.T) {
	// a: 600/60 × 10 s = 100 slots / 20 = 5; b: min(6000, 600000/1000 = 600)
	// → 100 slots / 10 = 10. The bound is the larger: 10.
	cfg, err := config.Parse([]byte("models:\n  a: {rpm: 600, max_concurrency: 20}\n  b: {rpm: 6000, tpm: 600000, max_concurrency: 10}\n"), nil)
	require.NoError(t, err)
	bound, err := replicaBound(cfg, 10, 1000)
	require.NoError(t, err)
	require.Equal(t, 10, bound)

	cfg, err = config.Parse([]byte("models:\n  a: {max_concurrency: 20}\n"), nil)
	require.NoError(t, err)
	_, err = replicaBound(cfg, 10, 1000)
	require.ErrorContains(t, err, "neither rpm nor tpm")
}

func TestCheckKEDAFails(t *testing.T) {
	s := k8s(t, strings.Replace(kedaManifests, "MAX", "10", 1))
	require.Empty(t, checkKEDA(s.objects, s.containers, s.secrets))

	for _, tc := range []struct{ from, to, want string }{
		{"MAX", "11", "maxReplicaCount 11 exceeds 10"},
		{"  maxReplicaCount: MAX\n", "", "maxReplicaCount must be set"},
		{"queueName: llmq.lane.low", "queueName: llmq.lane.lo", "no rabbitmq trigger for lane low"},
		{"queueName: llmq.lane.low", "queueName: llmq.lane.lo", `rabbitmq trigger on queueName "llmq.lane.lo", not a lane`},
		{"queueName: llmq.lane.low", "queueName: llmq.jobs.low", `rabbitmq trigger on queueName "llmq.jobs.low", not a lane`},
		{"scaleTargetRef: {name: consumer}", "scaleTargetRef: {name: worker}", `scaleTargetRef "worker" is no Deployment`},
		{"key: LLMQ_AMQP_URL}", "key: AMQP_URL}", `Secret s has no key "AMQP_URL"`},
		{"authenticationRef: {name: auth}}\n    - {type: rabbitmq, metadata: {queueName: llmq.lane.low}", "authenticationRef: {name: nope}}\n    - {type: rabbitmq, metadata: {queueName: llmq.lane.low}", `authenticationRef "nope"`},
		{`llmq.io/typical-latency-seconds: "10"`, `llmq.io/typical-latency-seconds: "ten"`, "must state the assumptions"},
	} {
		text := strings.Replace(strings.Replace(kedaManifests, tc.from, tc.to, 1), "MAX", "10", 1)
		require.NotEqual(t, kedaManifests, strings.Replace(kedaManifests, tc.from, tc.to, 1), "snippet %q not found", tc.from)
		s := k8s(t, text)
		requireErr(t, checkKEDA(s.objects, s.containers, s.secrets), tc.want)
	}
}

func TestCheckGraceFails(t *testing.T) {
	root := fakeRoot(t)
	cf := compose(t, root, "services:\n  c:\n    image: i\n    command: [consumer, run]\n    stop_grace_period: 60s\n")
	// Defaults: timeout 120s + wait 0 + shutdown grace 30s = 150s.
	requireErr(t, checkGrace(cf.containers, nil), "must exceed provider.timeout + provider.wait_timeout + worker.shutdown_grace = 2m30s")
	cf = compose(t, root, "services:\n  c:\n    image: i\n    command: [consumer, run]\n    stop_grace_period: 151s\n")
	require.Empty(t, checkGrace(cf.containers, nil))
}

func TestCheckSecurityFails(t *testing.T) {
	s := k8s(t, `apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  template:
    spec:
      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: c
          image: i
          securityContext: {readOnlyRootFilesystem: true, capabilities: {drop: [NET_RAW]}}
`)
	errs := checkSecurity(s.containers)
	requireErr(t, errs, "capabilities.drop: [ALL]")
	requireErr(t, errs, "allowPrivilegeEscalation: false")
	require.Len(t, errs, 2, "pod-level runAsNonRoot and seccomp count: %v", errs)
}

func TestCheckKustomizationFails(t *testing.T) {
	dir := t.TempDir()
	var k doc
	require.NoError(t, yaml.Unmarshal([]byte("resources: [missing.yaml]\nimages: [{name: docker.io/llmq, newTag: x}]\n"), &k))
	errs := checkKustomization(k, dir, "ghcr.io/llmq/llmq")
	requireErr(t, errs, "resource missing.yaml")
	requireErr(t, errs, "image override docker.io/llmq")
}

func TestCheckSimProviderFails(t *testing.T) {
	root := fakeRoot(t)
	require.NoError(t, os.WriteFile(filepath.Join(root, "deploy", "sim.yaml"), []byte("sim"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "deploy", "c.yaml"), []byte("models:\n  m: {rpm: 120, tpm: 1000}\n  n: {rpm: 1}\n"), 0o644))
	cf := compose(t, root, `services:
  llmsim:
    image: i
    command: [llmsim, --addr, "0.0.0.0:8000", --config, /sim.yaml]
    volumes: ["./deploy/sim.yaml:/sim.yaml"]
  c:
    image: i
    command: [consumer, run]
    volumes: ["./deploy/c.yaml:/c.yaml"]
    environment:
      LLMQ_CONFIG: /c.yaml
      LLMQ_PROVIDER_BASE_URL: http://llmsim:8001/v2
      LLMQ_PROVIDER_API_KEY: wrong
`)
	parse := func([]byte) (simulator, error) {
		return simulator{keys: []string{"right"}, models: map[string][2]int64{"m": {60, 0}}}, nil
	}
	errs := checkSimProvider(cf.containers, nil, parse)
	requireErr(t, errs, "but llmsim llmsim listens on port 8000")
	requireErr(t, errs, "path /v2")
	requireErr(t, errs, "provider key is not one of llmsim llmsim's api_keys")
	requireErr(t, errs, "model n is not served by llmsim")
	requireErr(t, errs, "model m quota rpm 120 tpm 1000 exceeds what llmsim llmsim enforces (rpm 60 tpm 0)")

	failing := func([]byte) (simulator, error) {
		return simulator{}, errors.New("models: at least one model is required")
	}
	requireErr(t, checkSimProvider(cf.containers, nil, failing), "llmsim --config /sim.yaml: models: at least one model")
}

func TestCheckKafkaGroupsFails(t *testing.T) {
	s := k8s(t, `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: so}
spec:
  triggers: [{type: kafka, metadata: {topic: llmq.lane.high, consumerGroup: llmq-workers.lane.high}}]
`)
	require.Empty(t, checkKafkaGroups(s.objects, map[string]bool{"llmq-workers": true, ".lane.": true}))
	requireErr(t, checkKafkaGroups(s.objects, map[string]bool{"llmq-consumer": true, ".lane.": true}), `consumerGroup "llmq-workers.lane.high" is not the group`)
	wrongLane := k8s(t, `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: so}
spec:
  triggers: [{type: kafka, metadata: {topic: llmq.lane.high, consumerGroup: llmq-workers.lane.low}}]
`)
	requireErr(t, checkKafkaGroups(wrongLane.objects, map[string]bool{"llmq-workers": true, ".lane.": true}), `is not the group`)
}

func TestCheckBrokerUsersFails(t *testing.T) {
	hash := func(pw string) string {
		salt := []byte{1, 2, 3, 4}
		sum := sha256.Sum256(append(append([]byte{}, salt...), pw...))
		return base64.StdEncoding.EncodeToString(append(salt, sum[:]...))
	}
	consumer := func(url string) container {
		return container{where: "consumer", command: []string{"consumer", "run"},
			env:   map[string]string{"LLMQ_CONFIG": "/c.yaml", "LLMQ_AMQP_URL": url},
			files: map[string]string{"/c.yaml": "tenants:\n  demo:\n    broker_users: [pub]\n"}}
	}
	defs := func(pubTags, configure, write, read string) rabbitDefinitions {
		var d rabbitDefinitions
		text := `{"users":[{"name":"llmq","password_hash":"` + hash("llmq") + `","tags":["administrator"]},
			{"name":"pub","password_hash":"` + hash("pub") + `","tags":[` + pubTags + `]}],
			"permissions":[{"user":"llmq","vhost":"/","configure":".*","write":".*","read":".*"},
			{"user":"pub","vhost":"/","configure":"` + configure + `","write":"` + write + `","read":"` + read + `"}]}`
		require.NoError(t, json.Unmarshal([]byte(text), &d))
		return d
	}
	good := defs(``, `^$`, `^llmq\\.jobs$`, `^$`)
	llmqURL := "amqp://llmq:llmq@rabbitmq:5672/"
	require.Empty(t, checkBrokerUsers(good, []container{consumer(llmqURL)}, nil), "the good snippet passes")

	requireErr(t, checkBrokerUsers(defs(``, `^$`, `^llmq\\.jobs$`, `.*`), []container{consumer(llmqURL)}, nil), "a publisher reads nothing")
	requireErr(t, checkBrokerUsers(defs(``, `^$`, `.*`, `^$`), []container{consumer(llmqURL)}, nil), "reaches llmq.lanes")
	requireErr(t, checkBrokerUsers(defs(``, `^llmq.*`, `^llmq\\.jobs$`, `^$`), []container{consumer(llmqURL)}, nil), "a publisher configures nothing")
	requireErr(t, checkBrokerUsers(defs(``, `^$`, `^$`, `^$`), []container{consumer(llmqURL)}, nil), "does not let it publish to llmq.jobs")
	requireErr(t, checkBrokerUsers(defs(`"impersonator"`, `^$`, `^llmq\\.jobs$`, `^$`), []container{consumer(llmqURL)}, nil), "could forge user_id")
	requireErr(t, checkBrokerUsers(good, []container{consumer("amqp://llmq:wrong@rabbitmq:5672/")}, nil), "does not match")
	requireErr(t, checkBrokerUsers(good, []container{consumer("amqp://pub:pub@rabbitmq:5672/")}, nil), "needs configure, write and read .*")
	requireErr(t, checkBrokerUsers(good, []container{consumer("amqp://nobody:x@rabbitmq:5672/")}, nil), "is not in the definitions")
	unknown := consumer(llmqURL)
	unknown.files["/c.yaml"] = "tenants:\n  demo:\n    broker_users: [ghost]\n"
	requireErr(t, checkBrokerUsers(good, []container{unknown}, nil), `broker user "ghost" is not a RabbitMQ user`)
	own := consumer(llmqURL)
	own.files["/c.yaml"] = "tenants:\n  demo:\n    broker_users: [llmq]\n"
	requireErr(t, checkBrokerUsers(good, []container{own}, nil), "is llmq's own user")

	_, err := brokerDefs(container{where: "rabbitmq", files: map[string]string{}})
	require.ErrorContains(t, err, "load_definitions")
	_, err = brokerDefs(container{where: "rabbitmq", files: map[string]string{"/etc/rabbitmq/conf.d/x.conf": "load_definitions = /d.json\n"}})
	require.ErrorContains(t, err, "not a file mounted")
}
