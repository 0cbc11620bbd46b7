package check

import (
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/sim"
)

// repo is the repository's deployment files, loaded once per test.
type repo struct {
	root       string
	build      dockerBuild
	image      string // repository of the image the Dockerfile builds
	compose    composeFile
	k8s        k8sSet
	prometheus doc
	containers []container
	// sources are the Secrets and ConfigMaps envFrom may name.
	sources map[string]map[string]string
}

func loadRepo(t *testing.T) *repo {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err, "repository root not found from %s", root)
	r := &repo{root: root}
	read := func(rel string) []byte {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
		require.NoError(t, err)
		return data
	}

	r.build, err = parseDockerfile(string(read("Dockerfile")))
	require.NoError(t, err)

	r.compose, err = loadCompose(root, "docker-compose.yml", read("docker-compose.yml"))
	require.NoError(t, err)
	for img, df := range r.compose.builds {
		if df == "Dockerfile" {
			require.Empty(t, r.image, "two compose images are built from the Dockerfile: %s and %s", r.image, img)
			r.image = imageRepo(img)
		}
	}
	require.NotEmpty(t, r.image, "no docker-compose service builds the Dockerfile (build: .)")

	files := map[string][]byte{}
	k8sDir := filepath.Join(root, "deploy", "k8s")
	err = filepath.WalkDir(k8sDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !isYAML(p) || filepath.Base(p) == "kustomization.yaml" {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		files[filepath.ToSlash(rel)], err = os.ReadFile(p)
		return err
	})
	require.NoError(t, err)
	require.NotEmpty(t, files, "no manifests under deploy/k8s")
	r.k8s, err = loadK8s(files)
	require.NoError(t, err)

	require.NoError(t, yaml.Unmarshal(read("deploy/prometheus/prometheus.yml"), &r.prometheus))

	r.containers = append(append([]container{}, r.compose.containers...), r.k8s.containers...)
	r.sources = map[string]map[string]string{}
	maps.Copy(r.sources, r.k8s.configMaps)
	maps.Copy(r.sources, r.k8s.secrets)
	return r
}

func isYAML(p string) bool {
	return strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")
}

func report(t *testing.T, errs []error) {
	t.Helper()
	for _, err := range errs {
		t.Error(err)
	}
}

func knownEnv() map[string]bool {
	known := map[string]bool{"LLMQ_CONFIG": true}
	for _, n := range config.EnvNames() {
		known[n] = true
	}
	return known
}

// TestDeployFilesParse: every YAML and JSON file under deploy/ and the
// compose file parse (multi-document YAML included).
func TestDeployFilesParse(t *testing.T) {
	r := loadRepo(t)
	err := filepath.WalkDir(filepath.Join(r.root, "deploy"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case isYAML(p):
			if _, err := decodeAll(data); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		case strings.HasSuffix(p, ".json"):
			if _, err := decodeJSON(data); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		}
		return nil
	})
	require.NoError(t, err)
}

func TestDockerfileBuildsEveryBinary(t *testing.T) {
	r := loadRepo(t)
	report(t, checkDockerfile(r.build, r.root))
	for _, bin := range []string{"producer", "consumer", "llmsim", "llmq"} {
		if _, ok := r.build.binaries[bin]; !ok {
			t.Errorf("Dockerfile does not build %s (docs/design.md#binaries lists it)", bin)
		}
	}
}

func TestImagesAndCommands(t *testing.T) {
	r := loadRepo(t)
	report(t, checkImages(r.containers, r.image, r.build, r.root))
}

func TestEnvNamesAreInTheContract(t *testing.T) {
	r := loadRepo(t)
	report(t, checkEnv(r.containers, knownEnv(), r.sources))
}

func TestConfigsLoad(t *testing.T) {
	r := loadRepo(t)
	report(t, checkConfigs(r.containers, r.sources))
	// The compose config file on its own, without the environment.
	data, err := os.ReadFile(filepath.Join(r.root, "deploy", "llmq.yaml"))
	require.NoError(t, err)
	_, err = config.Parse(data, nil)
	require.NoError(t, err, "deploy/llmq.yaml")
	// Every ConfigMap key that is an llmq configuration.
	for name, kv := range r.k8s.configMaps {
		if v, ok := kv["llmq.yaml"]; ok {
			_, err := config.Parse([]byte(v), nil)
			require.NoError(t, err, "ConfigMap %s llmq.yaml", name)
		}
	}
}

func TestProbesAndPorts(t *testing.T) {
	r := loadRepo(t)
	served := map[string]map[string]bool{}
	for _, c := range r.containers {
		bin := c.binary()
		if _, ok := r.build.binaries[bin]; !ok || served[bin] != nil || bin == "healthprobe" {
			continue
		}
		routes, err := servedRoutes(r.root, bin)
		if err != nil {
			t.Errorf("routes of %s: %v", bin, err)
			routes = map[string]bool{}
		}
		served[bin] = routes
	}
	report(t, checkProbes(r.containers, r.sources, served))
	report(t, checkScrape(r.prometheus, r.compose, r.sources, served))
	for _, f := range strs(r.prometheus["rule_files"]) {
		rel, ok := strings.CutPrefix(f, "/etc/prometheus/")
		if _, err := os.Stat(filepath.Join(r.root, "deploy", "prometheus", rel)); !ok || err != nil {
			t.Errorf("prometheus rule file %s is not in deploy/prometheus (mounted at /etc/prometheus)", f)
		}
	}
}

func TestMetricNamesExistInCode(t *testing.T) {
	r := loadRepo(t)
	known, err := codeMetricNames(r.root)
	require.NoError(t, err)
	t.Logf("%d llmq_ metric names in the code", len(known))
	for _, dir := range []string{"deploy/grafana/dashboards", "deploy/prometheus"} {
		entries, err := os.ReadDir(filepath.Join(r.root, filepath.FromSlash(dir)))
		require.NoError(t, err)
		for _, e := range entries {
			p := filepath.Join(r.root, filepath.FromSlash(dir), e.Name())
			data, err := os.ReadFile(p)
			require.NoError(t, err)
			refs := map[string]bool{}
			if strings.HasSuffix(p, ".json") {
				v, err := decodeJSON(data)
				require.NoError(t, err, p)
				metricRefs(v, refs)
			} else {
				docs, err := decodeAll(data)
				require.NoError(t, err, p)
				for _, d := range docs {
					metricRefs(d, refs)
				}
			}
			report(t, checkMetrics(dir+"/"+e.Name(), refs, known))
		}
	}
}

func TestKEDAReplicaBound(t *testing.T) {
	r := loadRepo(t)
	scaled := 0
	for _, o := range r.k8s.objects {
		if o.kind() == "ScaledObject" {
			scaled++
		}
	}
	require.NotZero(t, scaled, "no KEDA ScaledObject under deploy/k8s")
	report(t, checkKEDA(r.k8s.objects, r.k8s.containers, r.k8s.secrets))
	groups, err := packageLiterals(filepath.Join(r.root, "internal", "broker", "kafka"))
	require.NoError(t, err)
	report(t, checkKafkaGroups(r.k8s.objects, groups))
}

func TestConsumerStopGrace(t *testing.T) {
	r := loadRepo(t)
	report(t, checkGrace(r.containers, r.sources))
}

func TestSecurityContext(t *testing.T) {
	r := loadRepo(t)
	report(t, checkSecurity(r.containers))
}

func TestKustomization(t *testing.T) {
	r := loadRepo(t)
	dir := filepath.Join(r.root, "deploy", "k8s")
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	require.NoError(t, err)
	var k doc
	require.NoError(t, yaml.Unmarshal(data, &k))
	report(t, checkKustomization(k, dir, r.image))
}

func parseSim(data []byte) (simulator, error) {
	cfg, err := sim.ParseConfig(data)
	if err != nil {
		return simulator{}, err
	}
	out := simulator{keys: cfg.APIKeys, models: map[string][2]int64{}}
	for name, m := range cfg.Models {
		out.models[name] = [2]int64{m.RPM, m.TPM}
	}
	return out, nil
}

func TestComposeProviderIsTheSimulator(t *testing.T) {
	r := loadRepo(t)
	report(t, checkSimProvider(r.compose.containers, nil, parseSim))
}

func TestBrokerUsersArePublishOnly(t *testing.T) {
	r := loadRepo(t)
	var rabbit *container
	for i, c := range r.compose.containers {
		if c.owner == "rabbitmq" {
			rabbit = &r.compose.containers[i]
		}
	}
	require.NotNil(t, rabbit, "docker-compose.yml has no rabbitmq service")
	defs, err := brokerDefs(*rabbit)
	require.NoError(t, err)
	report(t, checkBrokerUsers(defs, amqpContainers(r.compose.containers), r.sources))
	var publishers int
	for _, c := range amqpContainers(r.compose.containers) {
		cfg, err := containerConfig(c, r.sources)
		require.NoError(t, err)
		publishers += len(cfg.BrokerUserTenants())
	}
	require.NotZero(t, publishers, "the compose configuration maps a broker user to a tenant, so the check has one to hold")
}
