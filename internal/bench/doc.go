// Package bench is llmq's strategy comparison (`llmq bench`): it runs each
// rate-control strategy (retry, ratelimit, shaping, adaptive, auto) through
// the real consumer path — worker, provider client, governor, Postgres store
// and a broker (in-memory, or RabbitMQ or Kafka with half the jobs
// submitted over the producer API: Env.Broker) — against llmsim served over
// loopback, over a set
// of scenarios (steady overload, cold start after idle, mixed short/long,
// a limit halved mid-run, high concurrency), and reports goodput as a share
// of the binding limit, the 429 share of calls, queue-to-result latency,
// provider calls per job and failed/dead jobs, as a table, a PNG chart per
// scenario and a JSON file of the raw per-second series.
//
// It reproduces the "Throughput performance comparison" of the Model
// Studio rate-limiting guide that llmq's rate control follows
// (docs/design.md#strategies; the targets are docs/design.md#targets). The
// retry strategy is the guide's basic retry client (N workers, no
// admission, in-process exponential backoff with jitter on 429/5xx, 5
// retries); the other four are the governor's compositions
// (internal/ratecontrol).
package bench
