// Package quota shares one provider quota among the consumer replicas that
// call it (seed, "Production environment considerations — Distributed rate
// limiting": "each instance throttles independently; total usage may exceed
// the limit; use a centralized counter"). Providers limit per account and
// model, so N replicas of `consumer run` must together stay inside each
// model's RPM, TPM, RPS, TPS and concurrency, and together use nearly all
// of it.
//
// It coordinates through Postgres without a round trip per request: each
// replica runs a Coordinator whose one goroutine (Run) holds a lease per
// model in quota_members and, every interval (default 1s), in one
// transaction of two round trips:
//
//   - takes the model's advisory lock, renews its lease (expires_at =
//     now() + quota.lease_ttl, by the database's clock) with its demand,
//     deletes expired leases and reads the live members;
//   - computes its target share = max(demand_i, floor) / Σ max(demand_j,
//     floor) per unit (requests: RPM, RPS, concurrency; tokens: TPM, TPS),
//     with demand capped at the limit and floor = 5% of the limit / N;
//   - applies min(target, 1 − Σ shares the others have applied): a
//     decrease reaches the governor (Governor.SetLimits) before the commit,
//     an increase only after it.
//
// Every replica publishes the share it has applied, and raises it only
// under the lock into headroom no other live lease claims, so the applied
// shares never sum above the limit — during joins, leaves, demand shifts
// and slow rounds alike. (The simpler rule "raise only after seeing the
// same membership for two intervals" assumes every other replica has run a
// round in between and ignores demand changes; the headroom rule needs no
// such timing assumption.) A newcomer starts at 0 and gets room as soon as
// the others have shrunk (its second round, typically). A replica that dies
// keeps its share until its lease expires; the others absorb it in their
// next round after the expiry (within lease_ttl + 2 intervals). Close hands
// the lease back, so they absorb it at once.
//
// When a round fails (Postgres unreachable) the replica falls back to a
// conservative local share: min(applied, fallback_share) while its lease
// may still be live, fallback_share × limit once it must have expired
// (fallback_share 0 fails closed), logged once and recovered automatically
// with the next round that commits. While several replicas run on their
// fallback share, their sum may exceed the limit: that is the price of
// staying up without Postgres, chosen by fallback_share.
//
// 429 feedback: the consumer calls Report429 when its governor sees a 429;
// the Run goroutine writes it to quota_penalties at once, and every other
// replica reads the penalties newer than the last it saw in its next round
// and calls Governor.Penalize, so the adaptive controllers of all replicas
// drain together. Nothing here depends on the broker.
//
// ratecontrol reads a zero limit as "none", so a share of 0 is applied as a
// tiny positive quota; a governor Acquire booked under it waits that long.
// That is why New pauses the governors and the consumer should start work
// only after Ready, and why an applied share that is positive never drops
// to 0 again (except with fallback_share 0, or after Close).
//
// Metrics: llmq_quota_share{model,dimension}, llmq_quota_members{model},
// llmq_quota_renewals_total, llmq_quota_round_seconds,
// llmq_quota_fallback, llmq_quota_penalties_total{direction}.
package quota
