package flow

import (
	"math"
	"sync"
	"time"
)

// Calibrator learns, per model, how llmq's estimates compare with what the
// provider bills, so that pre-deduction is accurate from settled usage
// (docs/design.md#calibration): the ratio of the provider's prompt_tokens
// to llmq's estimate, and the typical output length (completion_tokens).
// It also tracks how wrong the total pre-deduction was. Safe for
// concurrent use.
type Calibrator struct {
	mu sync.Mutex

	alpha        float64
	inputRatio   float64 // EMA of prompt_tokens / estimate
	ratioSamples int
	outRing      [outputWindow]float64 // last completions, for a windowed mean
	latRing      [outputWindow]float64 // their latencies in seconds (0 = unknown)
	survival     SurvivalTable         // built from the rings on demand
	survivalAt   int                   // outSamples when survival was built
	outSum       float64
	outMean      float64 // mean of the window
	outDev       float64 // EMA of |completion − mean|
	outSamples   int
	errSigned    float64 // EMA of (booked − actual)/actual
	errAbs       float64 // EMA of |booked − actual|/actual
	errSamples   int
	// DefaultOutput is the expected output before any sample (when the
	// request has no max_tokens either).
	defaultOutput float64
}

// outputWindow is how many settled completions the output estimate averages.
// A window (rather than a fast EMA) matters: short answers complete first,
// so a fast average dips after every burst of sends and rises when the long
// answers arrive, which makes bookings oscillate.
const outputWindow = 128

// coldSamples is how many settled calls the output estimate needs before
// it trusts its own mean (see Output and outputDevLocked).
const coldSamples = 32

// NewCalibrator returns a calibrator with ratio 1 and no output samples.
func NewCalibrator() *Calibrator {
	return &Calibrator{alpha: 0.1, inputRatio: 1, defaultOutput: 512}
}

// SetDefaultOutput sets the expected output before any sample (default
// 512): 0 for a model whose calls produce no output tokens (embeddings),
// so that nothing is booked for an output that never comes.
func (c *Calibrator) SetDefaultOutput(n float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.defaultOutput = max(n, 0)
}

// Input returns the calibrated input tokens for llmq's estimate.
func (c *Calibrator) Input(estimate int) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return math.Ceil(float64(estimate) * c.inputRatio)
}

// Output returns the expected output tokens of a request with the given
// max_tokens (0 = unknown): the mean of the last completions, capped by
// max_tokens, so bookings are unbiased and settlement moves both ways.
// While the window is filling, the estimate blends from the prior
// (max_tokens, or 512 without one) toward the mean: the first answers to
// come back are the short ones, so an early mean is biased low.
func (c *Calibrator) Output(maxTokens int) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.outputLocked(maxTokens)
}

func (c *Calibrator) outputLocked(maxTokens int) float64 {
	prior := c.defaultOutput
	if maxTokens > 0 {
		prior = float64(maxTokens)
	}
	v := prior
	if c.outSamples > 0 {
		v = c.outMean
		if c.outSamples < coldSamples && prior > v {
			v += (prior - v) * (1 - float64(c.outSamples)/coldSamples)
		}
		v = math.Ceil(v)
	}
	if maxTokens > 0 {
		v = math.Min(v, float64(maxTokens))
	}
	return v
}

// Booking is what auto needs of the calibration to book one call, under
// one lock: calibrated input, expected output (see Input and Output), the
// output's mean deviation and the reserve scale (outputDevLocked, reserveScaleLocked).
func (c *Calibrator) Booking(estimate, maxTokens int) (in, out, dev, scale float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return math.Ceil(float64(estimate) * c.inputRatio), c.outputLocked(maxTokens), c.outputDevLocked(), c.reserveScaleLocked()
}

// Observe feeds one settled call: llmq's input estimate, the total tokens
// booked for it, the provider's usage and the call's latency.
func (c *Calibrator) Observe(estimate int, booked float64, prompt, completion int, latency time.Duration) {
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
		if c.outSamples > 0 {
			c.outDev = ema(c.outDev, math.Abs(x-c.outMean), a, c.outSamples-1)
		}
		i := c.outSamples % outputWindow
		c.outSum += x - c.outRing[i]
		c.outRing[i] = x
		c.latRing[i] = latency.Seconds()
		c.outSamples++
		c.outMean = c.outSum / float64(min(c.outSamples, outputWindow))
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

// reserveScaleLocked is how much wider than its settled value auto's token
// reserve is kept while the output window fills: window/samples, between 1
// and 2. The first answers to settle are the short ones, so early estimates
// of output, and of what a call that is still running will produce, run
// low; the scale pays for that while it lasts, and gentler scales let a
// young calibration's minutes go over TPM (BENCHMARKS.md, "Tuning figures
// behind auto's constants"). Caller holds mu.
func (c *Calibrator) reserveScaleLocked() float64 {
	return min(max(outputWindow/float64(max(c.outSamples, 1)), 1), 2)
}

// outputDevLocked is the mean absolute deviation of output lengths. Until
// 32 calls have settled it is at least the mean (or the default output
// before any call): while little is known, assume a wide spread. Caller
// holds mu.
func (c *Calibrator) outputDevLocked() float64 {
	if c.outSamples < coldSamples {
		return max(c.outDev, c.outMean, c.defaultOutput*float64(boolInt(c.outSamples == 0)))
	}
	return c.outDev
}

// Calibration is a Calibrator's learned state as plain data, so that a
// replica calling the same model for the same workload can start from it
// instead of cold (internal/quota shares it through Postgres). Outputs and
// Latencies are the window of last completions, oldest first.
type Calibration struct {
	InputRatio     float64   `json:"input_ratio"`
	RatioSamples   int       `json:"ratio_samples"`
	Outputs        []float64 `json:"outputs"`
	Latencies      []float64 `json:"latencies"` // seconds; 0 = unknown
	OutputDev      float64   `json:"output_dev"`
	Samples        int       `json:"samples"` // settled completions seen in all
	EstimateBias   float64   `json:"estimate_bias"`
	EstimateError  float64   `json:"estimate_error"`
	EstimateSample int       `json:"estimate_samples"`
}

// Export returns the calibration learned so far.
func (c *Calibrator) Export() Calibration {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := min(c.outSamples, outputWindow)
	out := Calibration{InputRatio: c.inputRatio, RatioSamples: c.ratioSamples, OutputDev: c.outDev,
		Samples: c.outSamples, EstimateBias: c.errSigned, EstimateError: c.errAbs, EstimateSample: c.errSamples,
		Outputs: make([]float64, n), Latencies: make([]float64, n)}
	for k := range n {
		i := (c.outSamples - n + k) % outputWindow
		out.Outputs[k], out.Latencies[k] = c.outRing[i], c.latRing[i]
	}
	return out
}

// Import replaces a calibrator that has seen fewer settled calls than cal
// with cal, and reports whether it did. A calibrator that knows as much
// keeps its own: it measured this replica's traffic. Values outside what
// Observe could have produced are refused whole (cal comes from another
// process), so a bad row cannot make bookings absurd.
func (c *Calibrator) Import(cal Calibration) bool {
	if !cal.valid() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cal.Samples <= c.outSamples {
		return false
	}
	c.inputRatio, c.ratioSamples = cal.InputRatio, cal.RatioSamples
	c.outRing, c.latRing = [outputWindow]float64{}, [outputWindow]float64{}
	c.outSum = 0
	n := len(cal.Outputs)
	// Place the window so that the next Observe overwrites its oldest.
	for k, x := range cal.Outputs {
		i := (cal.Samples - n + k) % outputWindow
		c.outRing[i], c.latRing[i] = x, cal.Latencies[k]
		c.outSum += x
	}
	c.outSamples = cal.Samples
	c.outMean = c.outSum / float64(max(n, 1))
	c.outDev = cal.OutputDev
	c.errSigned, c.errAbs, c.errSamples = cal.EstimateBias, cal.EstimateError, cal.EstimateSample
	c.survivalAt = -1 // rebuild from the imported window
	return true
}

// valid reports a calibration Observe could have produced.
func (cal Calibration) valid() bool {
	n := len(cal.Outputs)
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if cal.Samples <= 0 || n != min(cal.Samples, outputWindow) || n != len(cal.Latencies) ||
		cal.RatioSamples < 0 || cal.EstimateSample < 0 ||
		!finite(cal.InputRatio) || cal.InputRatio < 0.1 || cal.InputRatio > 10 ||
		!finite(cal.OutputDev) || cal.OutputDev < 0 || !finite(cal.EstimateBias) || !finite(cal.EstimateError) {
		return false
	}
	for k := range n {
		if !finite(cal.Outputs[k]) || cal.Outputs[k] < 0 || !finite(cal.Latencies[k]) || cal.Latencies[k] < 0 {
			return false
		}
	}
	return true
}
