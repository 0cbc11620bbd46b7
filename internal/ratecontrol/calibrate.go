package ratecontrol

import (
	"math"
	"sync"
)

// Calibrator learns, per model, how llmq's estimates compare with what the
// provider bills (seed limitation "cold start" and the TPM blind spot of
// shaping): the ratio of the provider's prompt_tokens to EstimateTokens,
// and the typical output length (completion_tokens), from settled usage.
// It also tracks how wrong the total pre-deduction was. Safe for
// concurrent use.
type Calibrator struct {
	mu sync.Mutex

	alpha        float64
	inputRatio   float64 // EMA of prompt_tokens / estimate
	ratioSamples int
	outMean      float64 // EMA of completion_tokens
	outDev       float64 // EMA of |completion − mean|
	outSamples   int
	errSigned    float64 // EMA of (booked − actual)/actual
	errAbs       float64 // EMA of |booked − actual|/actual
	errSamples   int
	// DefaultOutput is the expected output before any sample (when the
	// request has no max_tokens either).
	defaultOutput float64
}

// NewCalibrator returns a calibrator with ratio 1 and no output samples.
func NewCalibrator() *Calibrator {
	return &Calibrator{alpha: 0.1, inputRatio: 1, defaultOutput: 512}
}

// Input returns the calibrated input tokens for llmq's estimate.
func (c *Calibrator) Input(estimate int) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return math.Ceil(float64(estimate) * c.inputRatio)
}

// Output returns the expected output tokens of a request with the given
// max_tokens (0 = unknown): mean plus half a mean deviation of what was
// seen (a little above the mean, so under-bookings that settle as debt are
// rarer than over-bookings that settle as refunds), capped by max_tokens.
// Before any sample it is max_tokens, or 512 without one.
func (c *Calibrator) Output(maxTokens int) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var v float64
	if c.outSamples == 0 {
		v = c.defaultOutput
		if maxTokens > 0 {
			v = float64(maxTokens)
		}
	} else {
		v = math.Ceil(c.outMean + 0.5*c.outDev)
	}
	if maxTokens > 0 {
		v = math.Min(v, float64(maxTokens))
	}
	return v
}

// Observe feeds one settled call: llmq's input estimate, the total tokens
// booked for it, and the provider's usage.
func (c *Calibrator) Observe(estimate int, booked float64, prompt, completion int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.alpha
	if estimate > 0 && prompt > 0 {
		r := min(max(float64(prompt)/float64(estimate), 0.1), 10)
		c.inputRatio = ema(c.inputRatio, r, a, c.ratioSamples)
		c.ratioSamples++
	}
	if completion >= 0 && prompt > 0 {
		x := float64(completion)
		if c.outSamples == 0 {
			c.outMean, c.outDev = x, 0
		} else {
			c.outDev = (1-a)*c.outDev + a*math.Abs(x-c.outMean)
			c.outMean = (1-a)*c.outMean + a*x
		}
		c.outSamples++
	}
	if actual := float64(prompt + completion); actual > 0 && booked > 0 {
		e := (booked - actual) / actual
		c.errSigned = ema(c.errSigned, e, a, c.errSamples)
		c.errAbs = ema(c.errAbs, math.Abs(e), a, c.errSamples)
		c.errSamples++
	}
}

// CalibrationSnapshot is the calibrator's state for metrics.
type CalibrationSnapshot struct {
	InputRatio    float64 // provider prompt_tokens / llmq estimate
	OutputMean    float64 // EMA of completion_tokens
	OutputDev     float64 // EMA of its absolute deviation
	EstimateError float64 // EMA of |booked − actual| / actual
	EstimateBias  float64 // EMA of (booked − actual) / actual; > 0 over-books
	Samples       int
}

// Snapshot returns the current calibration.
func (c *Calibrator) Snapshot() CalibrationSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CalibrationSnapshot{InputRatio: c.inputRatio, OutputMean: c.outMean, OutputDev: c.outDev,
		EstimateError: c.errAbs, EstimateBias: c.errSigned, Samples: c.outSamples}
}
