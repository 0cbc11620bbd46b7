// Package ratecontrol is llmq's rate-control core: it decides when a call to
// a provider may go so that llmq stays inside the provider's quotas (RPM,
// TPM, RPS, TPS, burst growth) at high utilisation. docs/design.md#rate-control
// describes the rules it implements and why, most of them from Alibaba Cloud
// Model Studio's rate-limiting guide ("the guide"). It does no I/O: the Governor
// reads an injectable clock and waits on runtime timers, so tests run in
// virtual time under testing/synctest. Everything is safe for concurrent use
// and imports nothing internal.
//
// What other packages use:
//
//	Governor, Permit   one model's admission: Acquire before a call, Settle or Cancel after it
//	Limits, Strategy   the quotas and the composition a Governor enforces
//	Snapshot           a Governor's state for metrics and quota sharing
//	Classify*, Kind    the diagnosis of a call's outcome in both error dialects (docs/design.md#classification)
//	Backoff            exponential backoff with full jitter (docs/design.md#backoff)
//	EstimateTokens     the input tokens of a chat body, before the provider counts them
//
// The building blocks the strategies compose (buckets, pacer, admission,
// token log, concurrency limiter, adaptive controller, rate cap,
// calibration) are package flow. In this package, pipeline.go builds a
// strategy's parts from Limits; classic.go is the admission of the guide's
// four strategies and auto.go auto's; permit.go settles a call; reserve.go
// and aging.go are auto's token reserve and its aging of the calls in
// flight.
//
// # Strategies (docs/design.md#strategies)
//
//	retry      admits at once; the caller only backs off (Backoff).
//	ratelimit  RPM bucket, full start (capacity = RPM) → semaphore (default 20), as the guide publishes it.
//	shaping    RPM and TPM warm-up buckets (empty start) pre-deducting the input estimate →
//	           semaphore → pacer inside the slot → settle output tokens, as the guide publishes it.
//	adaptive   controller-driven concurrency with an RPM/TPM budget (empty-start buckets) booking
//	           calibrated input + expected output, settling the difference.
//	auto       (default) books calibrated input + expected output and settles the difference;
//	           one caller at a time takes its concurrency slot, its pacer gap and its token
//	           booking at the moment it will be sent, where the provider counts it; TPM through
//	           a token log that aging, settlement and refunds correct in place, less a reserve
//	           for the output still unknown of the calls in flight; requests through a bucket
//	           of 5 ms of their rate (at least one request) with warm-up and slow-start restart;
//	           a token-aware pacer; a rate cap after 429s the limits did not foresee; adaptive
//	           concurrency with the quota as guiding limit; levels corrected from rate-limit
//	           headers.
package ratecontrol
