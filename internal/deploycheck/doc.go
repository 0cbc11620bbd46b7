// Package deploycheck holds no production code: its tests parse the
// Dockerfile, docker-compose.yml and every manifest under deploy/ and check
// their references against the code — images and commands against the
// Dockerfile and cmd/, LLMQ_* variables against config.EnvNames, embedded
// configuration against config.Parse, probes and ports against the routes
// and addresses the binaries serve, dashboard and rule metrics against the
// metric names in the Go source, and KEDA's replica bound against the
// configured quotas. There is no Docker engine or cluster here, so these
// static checks are what keeps the deployment files honest.
package deploycheck
