package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/sim"
)

// Scenario is one load pattern against one simulated model. Every field
// can be overridden from the command line (see cmd/llmq bench).
type Scenario struct {
	Name        string
	Description string
	// Limits the provider enforces (and llmq is configured with).
	RPM, TPM, RPS, TPS int64
	// Burst is the provider's growth-rate rule (zero = off).
	Burst sim.BurstConfig
	// Latency of the simulated model (congestion above Latency.Capacity).
	Latency sim.LatencyConfig
	// Output is the output-length mix (by request hash).
	Output sim.OutputMix
	// ErrorRate is the share of provider 5xx (500/503).
	ErrorRate float64
	// ChargeAtAdmission: the provider admits on input and charges the
	// whole usage at admission (sim.ModelConfig.ChargeAtAdmission).
	ChargeAtAdmission bool
	// InputChars is the length of each job's prompt (≈ chars/4 tokens).
	InputChars int
	// MaxTokens is each request's max_tokens.
	MaxTokens int
	// Phases publish jobs: Jobs at time At after the start.
	Phases []Phase
	// Duration of the run; the worker stops then.
	Duration time.Duration
	// Concurrency: retry's workers, the semaphore of ratelimit and
	// shaping, and the max_concurrency of adaptive and auto.
	Concurrency int
	// Warmup of shaping and auto (models.warmup).
	Warmup time.Duration
	// ServerQueue is the X-DashScope-Wait-Timeout auto sends: the guide's
	// server-side queuing for burst 429s (docs/design.md#server-queue), as
	// deploy/llmq.yaml sets provider.wait_timeout. The guide's four
	// strategies send none, as in its code; 0 = none for auto either.
	ServerQueue time.Duration
	// Change, when set, replaces the provider's limits at Change.At
	// without telling llmq (sim.SetModel).
	Change *LimitChange
	// [MeasureFrom, MeasureTo) is the steady goodput window; 0 = Warmup +
	// 5 s and Duration. Where a minute window binds, it spans whole
	// minutes: over a shorter span a client that front-loads a minute's
	// quota can show more than 100%.
	MeasureFrom, MeasureTo time.Duration
	// StopWhenDone ends the run as soon as every job reached a terminal
	// state (tests); Duration is then an upper bound.
	StopWhenDone bool
}

// Phase publishes Jobs at At.
type Phase struct {
	At   time.Duration
	Jobs int
}

// LimitChange is a provider limit change the client is not told about.
type LimitChange struct {
	At                 time.Duration
	RPM, TPM, RPS, TPS int64
}

// requestLimit and tokenLimit are the binding per-second limits (0 = none).
func requestLimit(rpm, rps int64) float64 { return minPos(float64(rpm)/60, float64(rps)) }
func tokenLimit(tpm, tps int64) float64   { return minPos(float64(tpm)/60, float64(tps)) }

func minPos(a, b float64) float64 {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	}
	return min(a, b)
}

// limitsAt returns the per-second request and token limits in force at t.
func (s Scenario) limitsAt(t time.Duration) (req, tok float64) {
	if c := s.Change; c != nil && t >= c.At {
		return requestLimit(c.RPM, c.RPS), tokenLimit(c.TPM, c.TPS)
	}
	return requestLimit(s.RPM, s.RPS), tokenLimit(s.TPM, s.TPS)
}

func (s Scenario) measureFrom() time.Duration {
	if s.MeasureFrom > 0 {
		return s.MeasureFrom
	}
	return s.Warmup + 5*time.Second
}

func (s Scenario) measureTo() time.Duration {
	if s.MeasureTo > 0 && s.MeasureTo <= s.Duration {
		return s.MeasureTo
	}
	return s.Duration
}

func (s Scenario) jobs() int {
	n := 0
	for _, p := range s.Phases {
		n += p.Jobs
	}
	return n
}

// Validate reports the first unusable setting.
func (s Scenario) Validate() error {
	switch {
	case s.Name == "":
		return fmt.Errorf("scenario: empty name")
	case s.RPM <= 0 && s.TPM <= 0 && s.RPS <= 0 && s.TPS <= 0:
		return fmt.Errorf("scenario %s: no limit set", s.Name)
	case s.Duration <= 0:
		return fmt.Errorf("scenario %s: duration must be positive", s.Name)
	case s.Concurrency <= 0:
		return fmt.Errorf("scenario %s: concurrency must be positive", s.Name)
	case s.jobs() <= 0:
		return fmt.Errorf("scenario %s: no jobs", s.Name)
	case s.MaxTokens <= 0:
		return fmt.Errorf("scenario %s: max_tokens must be positive", s.Name)
	}
	return nil
}

// simModel is the simulator's model config at the start.
func (s Scenario) simModel() sim.ModelConfig {
	lat := s.Latency
	out := s.Output
	return sim.ModelConfig{RPM: s.RPM, TPM: s.TPM, RPS: s.RPS, TPS: s.TPS, Burst: s.Burst, Latency: &lat, Output: &out,
		ChargeAtAdmission: s.ChargeAtAdmission}
}

// Model is the model name every scenario uses.
const Model = "qwen-plus"

// latency of a typical model, scaled: 200 ms to first token, 4 ms a token,
// slowing down above 40 concurrent requests.
var defaultLatency = sim.LatencyConfig{TTFT: sim.Duration(200 * time.Millisecond), TPT: sim.Duration(4 * time.Millisecond), Capacity: 40}

// Scenarios returns the default suite, scaled so the whole suite (the five
// strategies of a scenario run side by side) takes about 8 minutes on two
// cores. Minute windows (RPM/TPM) bind in steady, cold and mixed; the
// halving scenario binds on per-second limits (RPS), because a sliding
// minute that already holds the old quota refuses everything for 30 s after
// a halving, whatever the client does.
func Scenarios() []Scenario {
	short := sim.OutputMix{Short: 30, Long: 60, LongShare: 0.2}
	mixed := sim.OutputMix{Short: 30, Long: 600, LongShare: 0.3}
	all := []Scenario{
		{
			Name:        "steady",
			Description: "steady overload: a backlog above what RPM 600 lets through, short answers, RPM binds",
			RPM:         600, TPM: 1_000_000,
			Burst:   sim.BurstConfig{Floor: 20, Growth: 2, Window: sim.Duration(10 * time.Second)},
			Latency: defaultLatency, Output: short, InputChars: 200, MaxTokens: 256,
			Phases:   []Phase{{At: 0, Jobs: 1400}},
			Duration: 95 * time.Second, Concurrency: 20, Warmup: 10 * time.Second,
			MeasureFrom: 30 * time.Second, MeasureTo: 90 * time.Second,
		},
		{
			Name:        "cold",
			Description: "cold start after idle: burst rule (floor 4/s, growth 2× the 10 s average), a first backlog, 30 s idle, a second backlog; RPM 1200 binds",
			RPM:         1200, TPM: 2_000_000,
			Burst:   sim.BurstConfig{Floor: 4, Growth: 2, Window: sim.Duration(10 * time.Second)},
			Latency: defaultLatency, Output: short, InputChars: 200, MaxTokens: 256,
			Phases:   []Phase{{At: 0, Jobs: 300}, {At: 45 * time.Second, Jobs: 900}},
			Duration: 90 * time.Second, Concurrency: 40, Warmup: 10 * time.Second,
			MeasureFrom: 45 * time.Second,
		},
		{
			Name:        "mixed",
			Description: "mixed short/long (70% 30-token, 30% 600-token answers), RPM 600, TPM 90,000: TPM binds; 1% provider 5xx (docs/design.md#targets)",
			RPM:         600, TPM: 90_000,
			Burst:   sim.BurstConfig{Floor: 20, Growth: 2, Window: sim.Duration(10 * time.Second)},
			Latency: defaultLatency, Output: mixed, ErrorRate: 0.01, InputChars: 200, MaxTokens: 1024,
			Phases:   []Phase{{At: 0, Jobs: 900}},
			Duration: 105 * time.Second, Concurrency: 20, Warmup: 10 * time.Second,
			MeasureFrom: 40 * time.Second, MeasureTo: 100 * time.Second,
		},
		{
			Name:        "mixed-admission",
			Description: "mixed, against a provider that admits a call on its input and charges its whole usage (input and output) to the minute it admitted it",
			RPM:         600, TPM: 90_000, ChargeAtAdmission: true,
			Burst:   sim.BurstConfig{Floor: 20, Growth: 2, Window: sim.Duration(10 * time.Second)},
			Latency: defaultLatency, Output: mixed, ErrorRate: 0.01, InputChars: 200, MaxTokens: 1024,
			Phases:   []Phase{{At: 0, Jobs: 900}},
			Duration: 105 * time.Second, Concurrency: 20, Warmup: 10 * time.Second,
			MeasureFrom: 40 * time.Second, MeasureTo: 100 * time.Second,
		},
		{
			Name:        "halving",
			Description: "the platform halves the limit mid-run without notice: RPS 20 → 10 at 30 s (per-second limits bind)",
			RPS:         20, TPM: 0,
			Latency: defaultLatency, Output: short, InputChars: 200, MaxTokens: 256,
			Phases:   []Phase{{At: 0, Jobs: 1500}},
			Duration: 60 * time.Second, Concurrency: 20, Warmup: 10 * time.Second,
			Change:      &LimitChange{At: 30 * time.Second, RPS: 10},
			MeasureFrom: 15 * time.Second,
		},
		{
			Name:        "highconc",
			Description: "high concurrency: 200 workers/slots against RPM 600 and a model that slows down above 40 in flight",
			RPM:         600, TPM: 1_000_000,
			Burst:   sim.BurstConfig{Floor: 20, Growth: 2, Window: sim.Duration(10 * time.Second)},
			Latency: defaultLatency, Output: short, InputChars: 200, MaxTokens: 256,
			Phases:   []Phase{{At: 0, Jobs: 1400}},
			Duration: 95 * time.Second, Concurrency: 200, Warmup: 10 * time.Second,
			MeasureFrom: 30 * time.Second, MeasureTo: 90 * time.Second,
		},
	}
	for i := range all {
		all[i].ServerQueue = DeployedServerQueue
	}
	return all
}

// DeployedServerQueue is provider.wait_timeout in deploy/llmq.yaml: auto
// runs as deployed.
const DeployedServerQueue = 30 * time.Second

// Strategies is the default strategy list, in report order.
func Strategies() []ratecontrol.Strategy { return slices.Clone(ratecontrol.Strategies) }

// SelectScenarios picks scenarios by name from all ("" or "all" = every one).
func SelectScenarios(all []Scenario, names string) ([]Scenario, error) {
	if names == "" || names == "all" {
		return all, nil
	}
	var out []Scenario
	for _, n := range strings.Split(names, ",") {
		n = strings.TrimSpace(n)
		i := slices.IndexFunc(all, func(s Scenario) bool { return s.Name == n })
		if i < 0 {
			return nil, fmt.Errorf("unknown scenario %q", n)
		}
		out = append(out, all[i])
	}
	return out, nil
}

// ParseStrategies parses a comma-separated strategy list ("" or "all" = every one).
func ParseStrategies(names string) ([]ratecontrol.Strategy, error) {
	if names == "" || names == "all" {
		return Strategies(), nil
	}
	var out []ratecontrol.Strategy
	for _, n := range strings.Split(names, ",") {
		s, err := ratecontrol.ParseStrategy(strings.TrimSpace(n))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}
