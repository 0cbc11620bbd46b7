// Package quota shares one provider quota among the consumer replicas that
// call it (docs/design.md#shared-quota): replicas that each throttle on
// their own can together exceed the limit, so they need one count. Providers limit per account and
// model, so N replicas of `consumer run` must together stay inside each
// model's RPM, TPM, RPS, TPS and concurrency, and together use nearly all
// of it.
//
// It coordinates through Postgres without a round trip per request: each
// replica runs a Coordinator whose one goroutine (Run) holds a lease per
// model in quota_members and, every interval (default 1s), in one
// transaction of two round trips:
//
//   - takes the models' advisory locks, deletes expired leases (expires_at
//     is set by the database's clock) and reads the other live members
//     and the penalties they reported;
//   - computes its target share = max(demand_i, floor) / Σ max(demand_j,
//     floor) per unit (requests: RPM, RPS, concurrency; tokens: TPM, TPS),
//     with demand capped at the limit and floor = 5% of the limit / N;
//   - applies min(target, 1 − Σ shares the others have applied) and renews
//     its lease (now() + quota.lease_ttl) with its demand and that share. A
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
// first round after the expiry (within lease_ttl + 1 interval). Close
// hands the lease back, so they absorb it in their next round.
//
// Demand: a replica with jobs waiting (WithBacklog), or, without that
// hint, whose governor was busy in the last 30 s (admitted anything, had
// calls in flight or waiting, admission in debt, controller draining),
// wants the whole limit, so replicas under a backlog split evenly; an idle one wants 0 and
// keeps the floor; with the hint and no backlog it wants the rate it
// admitted. Until its governor has admitted anything it claims the others'
// mean demand, so a newcomer to a busy quota gets an equal share at once.
// WithDemand replaces all this.
//
// When rounds fail (Postgres unreachable) the replica falls back to a
// conservative local share: min(applied, fallback_share) at first — its
// lease may still be live and counted by the others, or Postgres may only
// be slow — and fallback_share × limit once a whole lease_ttl has passed
// since its last committed round (0 = fail closed). The transition is
// logged once; the first round that commits ends it. While several
// replicas run on their fallback share their sum may exceed the limit:
// the price of staying up without Postgres, chosen by fallback_share.
//
// 429 feedback: the consumer calls Report429 when its governor sees a 429;
// the Run goroutine writes it to quota_penalties at once, and every other
// replica reads the penalties newer than the last it saw in its next round
// (and those of the last 10 s or more again, the round's timeout and two
// intervals, applying each once: a penalty's seq is taken before its
// commit, so a lower one can appear after a higher one)
// and calls Governor.Penalize (once per model and round), so the adaptive
// controllers of all replicas drain together. Nothing here depends on the
// broker; only the kind, code and Retry-After are shared, never provider
// text.
//
// Learned state: governors that implement Learner (*ratecontrol.Governor)
// also write what they learned of each model (ratecontrol.Learned: the
// calibration window, auto's rate cap and the warm-up's progress) to
// quota_learned with the lease renewal, whenever it changed. A replica's
// first round reads the others' rows (the most informed calibration within
// the last hour; the lowest rate cap and the highest warmth among rows as
// fresh as a live lease) and hands them to its governors before its share
// lets them send, so a newcomer books like the replicas already running
// instead of at max_tokens with a doubled reserve, and sends at the rate
// the provider already sees instead of ramping from zero. The rows outlive
// the leases: a replica restarted after all others stopped still starts
// from their calibration, and from their warm-up too if it starts within a
// lease of their last renewal.
//
// Share 0: ratecontrol reads a zero limit as "none", so a paused share is
// applied as a tiny positive quota. ratecontrol plans an admission's wait
// once, when it books it, so a call booked under that quota would sleep
// for ages even after the share grows; the coordinator therefore also
// pauses the governor (Governor.Pause: callers wait before they book),
// renewed each round, and resumes it in the round that makes the share
// positive. New pauses every governor; strategies without a controller
// (ratelimit, shaping) get no pause, so the consumer should start work
// after Ready.
//
// Metrics: llmq_quota_share{model,dimension}, llmq_quota_members{model},
// llmq_quota_renewals_total, llmq_quota_round_seconds,
// llmq_quota_fallback, llmq_quota_penalties_total{direction},
// llmq_quota_learned_adopted_total.
package quota
