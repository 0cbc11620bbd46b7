package flow

import (
	"math"
	"sync"
	"time"
)

// State is the adaptive controller's state.
type State int

// Controller states (docs/design.md#adaptive).
const (
	StateProbing State = iota // healthy: EBP probing raises the limit
	StateHold                 // TPT degraded: keep the limit, observe
	StateDrain                // 429 seen: limit cut, admissions paused until cooldown ends
)

func (s State) String() string {
	switch s {
	case StateProbing:
		return "probing"
	case StateHold:
		return "hold"
	case StateDrain:
		return "drain"
	}
	return "unknown"
}

// ControllerConfig tunes the Controller. Zero fields take the defaults
// noted on each.
type ControllerConfig struct {
	Initial float64 // starting limit; default min(Max, 4)
	Min     float64 // floor; default 1
	Max     float64 // ceiling (MaxConcurrency); default 256
	// Gain scales the spring tension toward the watermark; default 1.
	Gain float64
	// MinStep is the additive thrust per round; default 1.
	MinStep float64
	// Accel caps growth acceleration (anti-burst governor): the step of a
	// round exceeds the previous round's step by at most Accel; default 1.
	Accel float64
	// Backoff multiplies the limit on a 429; default 0.7.
	Backoff float64
	// Cooldown is the DRAIN pause; default 1s, at least Retry-After, at most MaxCooldown.
	Cooldown    time.Duration
	MaxCooldown time.Duration // default 60s
	// IdleRestart: after this long without an admission the limit decays
	// (slow-start restart); default 30s.
	IdleRestart time.Duration
	// HoldFactor: TPT above HoldFactor × EMA is congestion; default 2.
	HoldFactor float64
	// HoldSamples consecutive congested (or clean) samples switch to (or
	// out of) HOLD; default 3.
	HoldSamples int
	// MinTPTTokens: samples with fewer output tokens do not feed TPT; default 16.
	MinTPTTokens int
	// Alpha is the EMA factor; default 0.2.
	Alpha float64
	// QuotaRPS and QuotaTPS are the known quotas (requests and tokens per
	// second) used as the guiding upper limit in the Little's-law ceiling;
	// 0 = unknown.
	QuotaRPS, QuotaTPS float64
}

func (c ControllerConfig) withDefaults() ControllerConfig {
	def := func(v *float64, d float64) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Max, 256)
	def(&c.Min, 1)
	c.Min = math.Min(c.Min, c.Max)
	def(&c.Initial, math.Min(c.Max, 4))
	c.Initial = math.Max(c.Min, math.Min(c.Initial, c.Max))
	def(&c.Gain, 1)
	def(&c.MinStep, 1)
	def(&c.Accel, 1)
	def(&c.Backoff, 0.7)
	def(&c.HoldFactor, 2)
	def(&c.Alpha, 0.2)
	if c.Cooldown <= 0 {
		c.Cooldown = time.Second
	}
	if c.MaxCooldown <= 0 {
		c.MaxCooldown = time.Minute
	}
	if c.IdleRestart <= 0 {
		c.IdleRestart = 30 * time.Second
	}
	if c.HoldSamples <= 0 {
		c.HoldSamples = 3
	}
	if c.MinTPTTokens <= 0 {
		c.MinTPTTokens = 16
	}
	return c
}

// Controller is the guide's ElasticCongestionController
// (docs/design.md#adaptive): a concurrency limit
// that probes upward with EBP (spring tension toward the historic high
// watermark plus additive thrust), holds when time per output token (TPT)
// degrades, drains on 429 (multiplicative backoff, cooldown, then fast
// recovery back toward the watermark), decays after idle (slow-start
// restart), grows no faster than the anti-burst governor allows and stays
// under a Little's-law ceiling derived from the known quota. Updates happen
// once per round (a round ends when as many calls completed as the limit),
// as TCP grows its window once per RTT. Pure: every method takes now.
type Controller struct {
	mu  sync.Mutex
	cfg ControllerConfig

	state      State
	limit      float64
	watermark  float64 // historic high: the limit when the last 429 hit, else the highest limit held for a round
	lastStep   float64
	drainUntil time.Time
	held       bool      // the drain is a Hold's alone (hold.go): no 429 began or joined it
	lastCut    time.Time // time of the last multiplicative decrease
	lastActive time.Time

	roundDone   int
	roundPeakIn int // highest in-flight seen this round

	emaTPT, emaLatency, emaTokens float64
	latDev                        float64 // EMA of |latency − emaLatency|
	overhead                      float64 // low-quantile latency: fixed cost (network, queue, TTFT)
	bad, good                     int
	samples                       int
	cuts, restarts                int
}

// NewController returns a controller in PROBING at cfg.Initial.
func NewController(cfg ControllerConfig, now time.Time) *Controller {
	cfg = cfg.withDefaults()
	return &Controller{cfg: cfg, limit: cfg.Initial, watermark: cfg.Max, lastActive: now, lastStep: 0}
}

// SetQuota updates the guiding quotas (per second) and the maximum.
func (c *Controller) SetQuota(rps, tps float64, max float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cfg.QuotaRPS, c.cfg.QuotaTPS = rps, tps
	if max > 0 {
		c.cfg.Max = max
		c.limit = math.Min(c.limit, max)
		c.watermark = math.Min(c.watermark, max)
	}
}

// Admit is called before each admission. It performs slow-start restart
// after idle and returns how long to wait if the controller is draining.
func (c *Controller) Admit(now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if idle := now.Sub(c.lastActive); idle > c.cfg.IdleRestart {
		// SSR: halve once per idle period, not below the initial limit.
		next := c.limit
		for i := time.Duration(0); i < idle/c.cfg.IdleRestart && next > c.cfg.Initial; i++ {
			next /= 2
		}
		c.limit = math.Max(math.Min(c.limit, c.cfg.Initial), next)
		c.lastStep = 0
		c.restarts++
	}
	if now.After(c.lastActive) {
		c.lastActive = now
	}
	if c.state == StateDrain {
		if now.Before(c.drainUntil) {
			return c.drainUntil.Sub(now)
		}
		c.state = StateProbing // fast recovery: spring back toward the watermark
	}
	return 0
}

// DrainLeft reports how long the drain after a 429 still lasts at now (0:
// none). Unlike Admit it changes nothing: a caller that passed Admit before
// the 429 came asks it again just before it sends.
func (c *Controller) DrainLeft(now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != StateDrain || !now.Before(c.drainUntil) {
		return 0
	}
	return c.drainUntil.Sub(now)
}

// Limit returns the current concurrency limit (at least 1).
func (c *Controller) Limit() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(math.Max(1, math.Floor(c.limit)))
}

// OnRateLimit is the 429 response: DRAIN, multiplicative backoff and a
// cooldown of at least retryAfter. A 429 of a call sent before the last cut
// was caused by the old limit and does not cut again.
func (c *Controller) OnRateLimit(now, sentAt time.Time, retryAfter time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cool := max(c.cfg.Cooldown, retryAfter)
	cool = min(cool, c.cfg.MaxCooldown)
	if until := now.Add(cool); until.After(c.drainUntil) {
		c.drainUntil = until
	}
	c.state = StateDrain
	c.held = false
	if !c.lastCut.IsZero() && sentAt.Before(c.lastCut) {
		return
	}
	c.watermark = math.Max(c.cfg.Min, c.limit)
	c.limit = math.Max(c.cfg.Min, c.limit*c.cfg.Backoff)
	c.lastStep = 0
	c.lastCut = now
	c.roundDone, c.roundPeakIn = 0, 0
	c.cuts++
}

// OnSuccess feeds a successful call: its latency, output and total tokens,
// and the number of calls in flight when it completed.
func (c *Controller) OnSuccess(now time.Time, latency time.Duration, outputTokens, totalTokens, inflight int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.cfg.Alpha
	lat := latency.Seconds()
	// Slow averages for the ceiling: it must not swing with each long answer.
	const slow = 0.05
	if c.samples > 0 {
		c.latDev = ema(c.latDev, math.Abs(lat-c.emaLatency), slow, c.samples)
	}
	c.emaLatency = ema(c.emaLatency, lat, slow, c.samples)
	c.emaTokens = ema(c.emaTokens, float64(totalTokens), slow, c.samples)
	c.samples++
	// Fixed cost estimate: a low quantile of latency (falls fast, rises slowly).
	switch {
	case c.samples == 1 || lat < c.overhead:
		c.overhead += 0.5 * (lat - c.overhead)
	default:
		c.overhead += 0.01 * (lat - c.overhead)
	}
	if outputTokens >= c.cfg.MinTPTTokens {
		// TPT over the generation part only: the fixed cost is taken out,
		// which removes most of the network/queue/TTFT noise.
		tpt := math.Max(lat-c.overhead, 0.1*lat) / float64(outputTokens)
		if c.emaTPT > 0 && tpt > c.emaTPT*c.cfg.HoldFactor {
			c.bad++
			c.good = 0
		} else {
			c.good++
			c.bad = 0
		}
		c.emaTPT = ema(c.emaTPT, tpt, a, boolInt(c.emaTPT > 0))
		switch {
		case c.state != StateDrain && c.bad >= c.cfg.HoldSamples:
			c.state = StateHold
		case c.state == StateHold && c.good >= c.cfg.HoldSamples:
			c.state = StateProbing
		}
	}
	if inflight > c.roundPeakIn {
		c.roundPeakIn = inflight
	}
	c.roundDone++
	if float64(c.roundDone) < math.Floor(c.limit) {
		return
	}
	saturated := float64(c.roundPeakIn) >= math.Floor(c.limit)-1
	c.roundDone, c.roundPeakIn = 0, 0
	if c.state != StateProbing || !saturated {
		return
	}
	c.probe()
}

// probe is the guide's probe_next_limit.
func (c *Controller) probe() {
	cur := c.limit
	wm := math.Max(c.watermark, cur)
	tension := 1 - cur/wm
	spring := cur * (1 + tension*c.cfg.Gain)
	linear := cur + c.cfg.MinStep
	raw := math.Max(spring, linear)
	// Anti-burst governor: the step may grow by at most Accel per round.
	step := math.Min(raw-cur, c.lastStep+c.cfg.Accel)
	c.lastStep = step
	next := cur + step
	if ceil := c.ceiling(); ceil > 0 {
		next = math.Min(next, math.Max(ceil, c.cfg.Min))
	}
	next = math.Min(next, c.cfg.Max)
	c.limit = math.Max(next, c.cfg.Min)
	if c.limit > c.watermark && c.limit >= cur {
		c.watermark = c.limit
	}
}

// ceiling is Little's law with the known quota as guide: the concurrency
// that the quota can keep busy is rate × latency, with 20% headroom. The
// latency is a high one (mean + 2 mean deviations), not the mean: LLM
// latencies are wide, and a ceiling at the mean starves the quota whenever
// a run of long answers holds the slots.
func (c *Controller) ceiling() float64 {
	if c.emaLatency <= 0 {
		return 0
	}
	rate := math.Inf(1)
	if c.cfg.QuotaRPS > 0 {
		rate = c.cfg.QuotaRPS
	}
	if c.cfg.QuotaTPS > 0 && c.emaTokens > 0 {
		rate = math.Min(rate, c.cfg.QuotaTPS/c.emaTokens)
	}
	if math.IsInf(rate, 1) {
		return 0
	}
	return rate * (c.emaLatency + 2*c.latDev) * 1.2
}

// ControllerSnapshot is the controller's state for metrics.
type ControllerSnapshot struct {
	State      State
	Limit      float64
	Watermark  float64
	Ceiling    float64 // 0 = none
	EMATPT     time.Duration
	Overhead   time.Duration
	EMALatency time.Duration
	Cuts       int // multiplicative decreases
	Restarts   int // slow-start restarts
}

// Snapshot returns the current state.
func (c *Controller) Snapshot() ControllerSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ControllerSnapshot{State: c.state, Limit: c.limit, Watermark: c.watermark, Ceiling: c.ceiling(),
		EMATPT: dur(c.emaTPT), Overhead: dur(c.overhead), EMALatency: dur(c.emaLatency),
		Cuts: c.cuts, Restarts: c.restarts}
}

func ema(prev, x, alpha float64, n int) float64 {
	if n == 0 {
		return x
	}
	return (1-alpha)*prev + alpha*x
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func dur(s float64) time.Duration { return time.Duration(s * 1e9) }

// Penalize is a 429 seen elsewhere (another replica): DRAIN, and one
// multiplicative cut unless a drain is already under way.
func (c *Controller) Penalize(now time.Time, retryAfter time.Duration) {
	c.mu.Lock()
	draining := c.state == StateDrain && now.Before(c.drainUntil)
	c.mu.Unlock()
	sent := now
	if draining {
		sent = time.Time{}.Add(1) // before any cut: extends the drain only
	}
	c.OnRateLimit(now, sent, retryAfter)
}
