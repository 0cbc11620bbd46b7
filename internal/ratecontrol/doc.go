// Package ratecontrol is llmq's rate-control core: it decides when a call to
// a provider may go so that llmq stays inside the provider's quotas (RPM,
// TPM, RPS, TPS, burst growth) at high utilisation. It does no I/O: every
// pure part takes the current time as an argument (like x/time/rate's
// ReserveN(t, n)) and the Governor reads an injectable clock and waits on
// runtime timers, so tests run in virtual time under testing/synctest.
// Everything is safe for concurrent use and imports nothing internal.
//
// # Map to the seed (shared/seed/rate-limiting-best-practices.md)
//
//	Bucket              "Request rate limiting": TokenBucket (capacity, refill, initial tokens, FIFO debt)
//	WarmupBucket        "Traffic shaping": advanced TokenBucket, continuous warm-up F(t); + slow-start restart
//	Pacer               "Traffic shaping": SmoothRateLimiter (minimum interval between sends)
//	Admission           "Dual admission control" generalised to named dimensions (requests, tokens, audio seconds…)
//	ConcurrencyLimiter  the concurrency semaphore, static or driven by the Controller
//	Controller          "Adaptive congestion control": EBP, TPT/HOLD, 429 DRAIN, SSR, governor, Little's law
//	Calibrator          "track_inflight"/pre-deduction made accurate from settled usage
//	Classify*, Kind     "Error diagnosis and strategy recommendations" table, both dialects
//	Backoff             "Basic retry": exponential backoff with full jitter
//	Strategy, Governor  the four client strategies as compositions, plus auto
//
// # Strategies (Governor)
//
//	retry      admits at once; the caller only backs off (Backoff).
//	ratelimit  RPM Bucket, full start (capacity = RPM) → semaphore (default 20). Seed as published.
//	shaping    RPM and TPM WarmupBuckets (empty start, warm-up) pre-deducting the input estimate →
//	           semaphore → Pacer inside the slot → settle output tokens. Seed as published.
//	adaptive   Controller-driven concurrency with an RPM/TPM budget (empty-start Buckets) booking
//	           calibrated input + expected output, settling the difference.
//	auto       (default) shaping done right:
//	           - every request books calibrated input + EXPECTED output and settles the
//	             difference, so unknown output cannot overrun TPM before settlement acts;
//	           - one caller at a time (a FIFO turnstile) takes its concurrency slot, its pacer
//	             gap and its token booking at the moment it will be sent, which is where the
//	             provider counts it; a settlement or refund counts for everyone behind, and
//	             wakes the caller at the head to move its booking and pacer slot earlier if it
//	             now fits (Admission.Recheck, Pacer.Recheck); other limiters (the RPM bucket)
//	             book first, so the token booking is at the moment the call really goes;
//	           - TPM through a WindowLog, not a bucket: each call is booked at its send time and
//	             every later correction (aging, settlement, refund) changes that same booking, as
//	             the provider's sliding minute does; a bucket can only move its level now, so late
//	             settlements and early refunds let a minute hold more than TPM (up to ~110% on
//	             TestTPMWithSettlement's workload before this design, ≤ 98.7% on 32 seeds after);
//	             a booking stays 100 ms past the minute (WindowLog.SetGuard), for a call that
//	             reaches the provider faster than the one whose room it takes;
//	           - aging: a call still running is charged the mean output of past calls that took
//	             longer (Calibrator.Survival), so long answers are charged seconds after they go
//	             out instead of when they end;
//	           - a statistical reserve for the output of the calls in flight (WithTokenReserve,
//	             defaultTokenReserve), wider while the calibration is young (Calibrator.reserveScaleLocked);
//	           - requests: a bucket of burst 1 refilled at (RPM − 1)/60, empty start with warm-up,
//	             slow-start restart after a minute idle;
//	           - a token-aware pacer (a send is followed by a gap of booked/token-rate), so sends
//	             released together by the concurrency limit do not bunch;
//	           - adaptive concurrency with the quota as guiding limit (cold start at one
//	             second of the request quota); the caller at the head of the turnstile is the
//	             only one that holds a slot while it waits for tokens;
//	           - self-calibration (Calibrator): input ratio, windowed output mean, estimate
//	             error; bucket levels lowered from x-ratelimit-remaining-* and emptied on a
//	             429 of their dimension; a token 429 while the log held its minute near the
//	             limit corrects the log but does not cut the send rate (the rate cap is for
//	             limits lower than configured and the growth-rate rule).
//
// # Departures from the seed
//
//   - Settle/Adjust first refills, then adds: the seed's adjust adds to a
//     stale level, which can waste refill at the capacity cap. Waits are
//     otherwise identical to the seed's formulas (a differential test holds
//     them to 1e-9 s); Durations are rounded up to the nanosecond so a
//     caller never goes early.
//   - The Pacer does not delay the very first send (the seed's starts its
//     interval at construction).
//   - The Controller updates once per round (as many completions as the
//     limit), as TCP does once per RTT, and only grows when the limit was
//     actually used (saturated round). One 429 cut per cooldown: a 429 of a
//     call sent before the last cut does not cut again.
//
// # Fixes for the seed's stated limitations of adaptive control
//
//   - TPT noise: TPT is computed over the generation part only — a running
//     low quantile of latency (network, queueing, time to first token)
//     is subtracted before dividing by output tokens —, calls with fewer
//     than 16 output tokens do not feed it, and HOLD needs 3 consecutive
//     congested samples (and 3 clean ones to leave).
//   - Large-request starvation: every waiting structure is strictly FIFO
//     (bucket debt books the order; the ConcurrencyLimiter queues waiters
//     in arrival order), so a short request can never overtake a long one.
//   - Cold start: quotas are enforced by the admission buckets from the
//     first call (the controller only sizes concurrency), the first limit is
//     one second of the request quota, the watermark starts at the maximum
//     so spring tension ramps up fast, and the Little's-law ceiling from the
//     known quota (rate × a high latency, mean + 2 deviations, × 1.2) caps it
//     where the quota cannot keep more calls busy. The Calibrator blends its
//     output estimate from max_tokens toward the observed mean over the
//     first 32 calls, because the first answers back are the short ones.
package ratecontrol
