// Package flow holds the building blocks of llmq's rate control. Each is
// pure — every method takes the current time, as x/time/rate's ReserveN(t,
// n) does — and safe for concurrent use; none imports anything internal.
//
//	Bucket              token bucket: initial tokens, FIFO debt (docs/design.md#token-bucket)
//	WarmupBucket        continuous warm-up, slow-start restart (docs/design.md#warm-up)
//	Pacer               minimum interval between sends, token-aware gaps (docs/design.md#pacer)
//	Admission           one reservation on every dimension: pre-deduct, settle, refund (docs/design.md#dual-admission)
//	WindowLog           sliding-window token log, corrected where a call was counted (docs/design.md#token-log)
//	ConcurrencyLimiter  FIFO semaphore whose limit may change (docs/design.md#concurrency)
//	Controller          adaptive concurrency: EBP probing, TPT hold, drain on 429 (docs/design.md#adaptive)
//	RateCap             send-rate cut and recovery after unforeseen 429s (docs/design.md#rate-cap)
//	Calibrator          input ratio, output length, output by age (docs/design.md#calibration)
//
// ratecontrol.Governor composes them into the strategies llmq offers;
// nothing outside package ratecontrol uses them directly.
package flow
