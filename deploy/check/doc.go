// Package check holds the deployment files to the code; it has no
// production code. Its tests parse the Dockerfile, docker-compose.yml and
// every manifest under deploy/ and check their references against the
// source, one file per target: the Dockerfile and the images and commands
// that run it (dockerfile_test.go), LLMQ_* variables, configuration files
// and stop grace against config.EnvNames and config.Parse
// (config_test.go), probes and ports against the routes and addresses the
// binaries serve (probes_test.go), Prometheus targets and the metrics of
// dashboards and rules against the metric names in the code
// (monitoring_test.go), KEDA's triggers and replica bound against the
// lanes and the configured quotas (keda_test.go), Kubernetes security
// contexts and the kustomization (k8s_test.go), and compose's simulated
// provider against the consumer's configuration (provider_test.go).
// repo_test.go runs every check on the repository's files,
// negative_test.go proves each check fails on a broken snippet. There is no
// Docker engine or cluster here, so these static checks are what keeps the
// deployment files honest.
package check
