package ratecontrol

import (
	"fmt"
	"time"
)

// Strategy names a composition of the parts (docs/design.md#strategies),
// chosen per model.
type Strategy string

// Strategies.
const (
	// StrategyRetry: no admission control; the caller only backs off.
	StrategyRetry Strategy = "retry"
	// StrategyRateLimit: the guide's request rate limiting: RPM bucket with
	// a full start, then a concurrency semaphore.
	StrategyRateLimit Strategy = "ratelimit"
	// StrategyShaping: the guide's traffic shaping as published: RPM and TPM
	// warm-up buckets, input tokens pre-deducted, pacer inside the
	// concurrency slot, output tokens settled.
	StrategyShaping Strategy = "shaping"
	// StrategyAdaptive: the guide's adaptive congestion control: the
	// Controller drives concurrency, with an RPM/TPM budget.
	StrategyAdaptive Strategy = "adaptive"
	// StrategyAuto (default): shaping done right plus adaptive concurrency
	// and self-calibration; see the package doc.
	StrategyAuto Strategy = "auto"
)

// Strategies lists the valid names.
var Strategies = []Strategy{StrategyRetry, StrategyRateLimit, StrategyShaping, StrategyAdaptive, StrategyAuto}

// ParseStrategy parses a strategy name; "" is auto.
func ParseStrategy(s string) (Strategy, error) {
	if s == "" {
		return StrategyAuto, nil
	}
	for _, v := range Strategies {
		if string(v) == s {
			return v, nil
		}
	}
	return "", fmt.Errorf("unknown rate-control strategy %q (want retry, ratelimit, shaping, adaptive or auto)", s)
}

// Limits of one model (config `models:`); zero means none or derived.
type Limits struct {
	RPM, TPM float64 // per minute
	RPS, TPS float64 // per second
	// MaxConcurrency caps calls in flight; 0 = 20 for ratelimit/shaping,
	// the controller's own maximum (256) for adaptive/auto.
	MaxConcurrency int
	// Warmup is the continuous warm-up period of shaping and auto;
	// 0 = 30 s (defaultWarmup), negative = none (empty start without
	// warm-up).
	Warmup time.Duration
}

// defaultWarmup is the warm-up period when Limits.Warmup is 0.
const defaultWarmup = 30 * time.Second

// defaultSemaphore is the guide's concurrency for ratelimit and shaping.
const defaultSemaphore = 20

func (l Limits) warmup() time.Duration {
	switch {
	case l.Warmup < 0:
		return 0
	case l.Warmup == 0:
		return defaultWarmup
	}
	return l.Warmup
}

// requestRate is the binding request rate per second (0 = none).
func (l Limits) requestRate() float64 { return minPositive(l.RPM/60, l.RPS) }

// tokenRate is the binding token rate per second (0 = none).
func (l Limits) tokenRate() float64 { return minPositive(l.TPM/60, l.TPS) }

func minPositive(a, b float64) float64 {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	}
	return min(a, b)
}
