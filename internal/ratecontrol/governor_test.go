package ratecontrol

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmq/llmq/internal/ratecontrol/flow"
)

// grant is one permit granted in a simulation.
type grant struct {
	seq    uint64
	at     time.Time
	tokens float64 // actual tokens (for TPM checks)
}

// maxInWindow returns the largest total of grants in any half-open window
// [t, t+w), over windows starting at each grant.
func maxInWindow(gs []grant, w time.Duration, weight func(grant) float64) float64 {
	v, _ := maxWindowAt(gs, w, weight)
	return v
}

// maxWindowAt also returns where the fullest window starts.
func maxWindowAt(gs []grant, w time.Duration, weight func(grant) float64) (float64, time.Time) {
	var at time.Time
	sort.Slice(gs, func(i, j int) bool { return gs[i].at.Before(gs[j].at) })
	var best, sum float64
	j := 0
	for i := range gs {
		for j < len(gs) && gs[j].at.Before(gs[i].at.Add(w)) {
			sum += weight(gs[j])
			j++
		}
		if sum > best {
			best, at = sum, gs[i].at
		}
		sum -= weight(gs[i])
	}
	return best, at
}

// TestGovernorRPM600 runs 10 virtual minutes at RPM 600 with 50 callers and
// an empty start (auto, no warm-up).
func TestGovernorRPM600(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		g := NewGovernor(StrategyAuto, Limits{RPM: 600, Warmup: -1})
		ctx, cancel := context.WithDeadline(t.Context(), start.Add(10*time.Minute))
		defer cancel()
		var mu sync.Mutex
		var grants []grant
		var wg sync.WaitGroup
		for c := range 50 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(c), 1))
				for {
					p, err := g.Acquire(ctx, Request{InputTokens: 100, MaxTokens: 100})
					if err != nil {
						if !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("acquire: %v", err)
						}
						return
					}
					mu.Lock()
					grants = append(grants, grant{seq: p.Seq(), at: p.SentAt()})
					mu.Unlock()
					lat := time.Duration((0.5 + 2.5*r.Float64()) * float64(time.Second))
					time.Sleep(lat) // the simulated call, in virtual time
					p.Settle(Result{PromptTokens: 100, CompletionTokens: 80, Latency: lat})
				}
			})
		}
		wg.Wait()
		if n := maxInWindow(grants, time.Minute, func(grant) float64 { return 1 }); n > 600 {
			t.Errorf("%v grants in one sliding minute, want ≤ 600", n)
		}
		if len(grants) < 5940 {
			t.Errorf("%d grants in 10 minutes, want ≥ 99%% of 6000", len(grants))
		}
		// FIFO: in admission order, grant times never go backwards.
		sort.Slice(grants, func(i, j int) bool { return grants[i].seq < grants[j].seq })
		for i := 1; i < len(grants); i++ {
			if grants[i].at.Before(grants[i-1].at) {
				t.Fatalf("FIFO broken: seq %d granted at %v before seq %d at %v", grants[i].seq,
					grants[i].at.Sub(start), grants[i-1].seq, grants[i-1].at.Sub(start))
			}
		}
		t.Logf("granted %d of 6000; concurrency limit %d", len(grants), g.Snapshot().ConcurrencyLimit)
	})
}

// TestWarmupCumulativeFollowsFormula: grants of a saturated shaping governor
// follow F(t) = R t²/2T (t ≤ T), R T/2 + R (t − T) after, within 1%.
func TestWarmupCumulativeFollowsFormula(t *testing.T) {
	const rpm, warm = 6000.0, 30 * time.Second
	R, T := rpm/60, warm.Seconds()
	formula := func(t float64) float64 {
		if t <= T {
			return R * t * t / (2 * T)
		}
		return R*T/2 + R*(t-T)
	}
	check := func(t *testing.T, times []time.Duration) {
		t.Helper()
		sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
		for at := 10 * time.Second; at <= 60*time.Second; at += 5 * time.Second {
			n := sort.Search(len(times), func(i int) bool { return times[i] > at })
			want := formula(at.Seconds())
			if math.Abs(float64(n)-want) > 0.01*want {
				t.Errorf("at %v: %d grants, formula %.1f (off by %.2f%%)", at, n, want, 100*math.Abs(float64(n)-want)/want)
			}
		}
	}
	t.Run("bucket", func(t *testing.T) {
		t0 := time.Unix(0, 0)
		w := flow.NewWarmupBucket(rpm, R, warm, t0)
		var times []time.Duration
		for range 6000 { // everyone queued at t0
			times = append(times, w.Reserve(t0, 1))
		}
		check(t, times)
	})
	t.Run("governor", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			g := NewGovernor(StrategyShaping, Limits{RPM: rpm, Warmup: warm, MaxConcurrency: 200})
			ctx, cancel := context.WithDeadline(t.Context(), start.Add(61*time.Second))
			defer cancel()
			var mu sync.Mutex
			var times []time.Duration
			var wg sync.WaitGroup
			for range 300 {
				wg.Go(func() {
					for {
						p, err := g.Acquire(ctx, Request{InputTokens: 10})
						if err != nil {
							return
						}
						mu.Lock()
						times = append(times, p.SentAt().Sub(start))
						mu.Unlock()
						time.Sleep(50 * time.Millisecond)
						p.Settle(Result{PromptTokens: 10, CompletionTokens: 10, Latency: 50 * time.Millisecond})
					}
				})
			}
			wg.Wait()
			check(t, times)
		})
	})
}

// TestTPMWithSettlement: output lengths unknown in advance (70% short, 30%
// long, answer time growing with output as in a real model), the provider
// bills 10% more input than llmq estimates; every sliding minute of actual
// tokens, counted at send time as the provider counts them, stays within
// TPM, as far as a statistical reserve can keep it there.
//
// The reserve (WithTokenReserve) keeps 5.5 standard deviations of what the
// calls in flight may still add. A minute that ends on a streak of young
// calls that all turn out long goes past that: seed 23 does so about once
// in 120 runs of this test, at 100.1–100.5% of TPM (BENCHMARKS.md, "Tuning
// figures behind auto's constants"). So one seed of 32 may pass TPM by up
// to tailAllowance; a weaker reserve puts several seeds over (3 deviations:
// 3–6 of 32), or one further.
func TestTPMWithSettlement(t *testing.T) {
	const seeds = 32
	const tailAllowance = 0.01
	worst, least := 0.0, 1.0
	var over []uint64
	for seed := range uint64(seeds) {
		w := runTPMWorkload(t, seed)
		t.Logf("seed %2d: peak sliding minute %.1f%% of TPM, %.1f%% of 10 minutes' TPM used; input ratio %.3f, output mean %.0f, estimate error %.3f (bias %+.3f)",
			seed, 100*w.peak, 100*w.used, w.cal.InputRatio, w.cal.OutputMean, w.cal.EstimateError, w.cal.EstimateBias)
		if w.peak > 1 {
			over = append(over, seed)
			t.Logf("seed %d: a sliding minute starting at %v held %.2f%% of TPM", seed, w.peakAt, 100*w.peak)
		}
		if w.peak > 1+tailAllowance {
			t.Errorf("seed %d: a sliding minute starting at %v held %.1f%% of TPM, want ≤ %.0f%%", seed, w.peakAt, 100*w.peak, 100*(1+tailAllowance))
		}
		// This mix is the hard case for the statistical reserve (few
		// calls a minute, bimodal output); see WithTokenReserve.
		if w.used < 0.78 {
			t.Errorf("seed %d: used %.1f%% of 10 minutes' TPM, want ≥ 78%%", seed, 100*w.used)
		}
		if math.Abs(w.cal.InputRatio-1.1) > 0.02 {
			t.Errorf("seed %d: input ratio learned %.3f, want 1.1", seed, w.cal.InputRatio)
		}
		worst, least = max(worst, w.peak), min(least, w.used)
	}
	t.Logf("%d seeds: fullest minute %.1f%% of TPM, least used %.1f%%", seeds, 100*worst, 100*least)
	if len(over) > 1 {
		t.Errorf("seeds %v each had a minute over TPM; the reserve's tail allows one", over)
	}
}

type tpmResult struct {
	peak, used float64 // fullest sliding minute and 10 minutes' total, as fractions of TPM
	peakAt     time.Duration
	cal        flow.CalibrationSnapshot
}

// runTPMWorkload runs TestTPMWithSettlement's workload for 10 virtual
// minutes: 40 callers, RPM 600, TPM 90k, 200–2,000 input tokens, 70% of
// answers 50–300 tokens and 30% 800–2,000, 300 ms + 20 ms per output token.
func runTPMWorkload(t *testing.T, seed uint64, opts ...Option) tpmResult {
	var res tpmResult
	synctest.Test(t, func(t *testing.T) {
		const tpm = 90_000.0
		start := time.Now()
		g := NewGovernor(StrategyAuto, Limits{RPM: 600, TPM: tpm}, opts...)
		ctx, cancel := context.WithDeadline(t.Context(), start.Add(10*time.Minute))
		defer cancel()
		var mu sync.Mutex
		var grants []grant
		var wg sync.WaitGroup
		for c := range 40 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(c), 2+seed))
				for {
					in := 200 + r.IntN(1800)
					out := 50 + r.IntN(250)
					if r.IntN(10) < 3 {
						out = 800 + r.IntN(1200)
					}
					p, err := g.Acquire(ctx, Request{InputTokens: in, MaxTokens: 2048})
					if err != nil {
						return
					}
					prompt := in * 11 / 10
					lat := 300*time.Millisecond + time.Duration(out)*20*time.Millisecond
					mu.Lock()
					grants = append(grants, grant{seq: p.Seq(), at: p.SentAt(), tokens: float64(prompt + out)})
					mu.Unlock()
					time.Sleep(lat)
					p.Settle(Result{PromptTokens: prompt, CompletionTokens: out, Latency: lat})
				}
			})
		}
		wg.Wait()
		tokens := func(g grant) float64 { return g.tokens }
		peak, peakAt := maxWindowAt(grants, time.Minute, tokens)
		var total float64
		for _, gr := range grants {
			total += gr.tokens
		}
		res = tpmResult{peak: peak / tpm, used: total / (10 * tpm), peakAt: peakAt.Sub(start), cal: g.Snapshot().Calibration}
	})
	return res
}

func TestGovernorCancelRefunds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// adaptive: empty-start buckets (no capacity clipping), one slot.
		g := NewGovernor(StrategyAdaptive, Limits{RPM: 60, MaxConcurrency: 1})
		p1, err := g.Acquire(t.Context(), Request{})
		if err != nil {
			t.Fatal(err)
		}
		// Second caller gets its token but waits for the slot; its context ends.
		ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
		defer cancel()
		if _, err := g.Acquire(ctx, Request{}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("acquire = %v, want deadline exceeded", err)
		}
		if s := g.Snapshot(); s.InFlight != 1 || s.Waiting != 0 {
			t.Fatalf("in flight %d waiting %d, want 1 and 0", s.InFlight, s.Waiting)
		}
		lvl := g.Snapshot().Levels[DimRequests]
		p1.Cancel()
		p1.Settle(Result{}) // no-op after Cancel
		if s := g.Snapshot(); s.InFlight != 0 || s.Levels[DimRequests] != lvl+1 {
			t.Fatalf("after cancel: in flight %d level %v (was %v)", s.InFlight, s.Levels[DimRequests], lvl)
		}
	})
}

func TestGovernorRetryAdmitsAtOnce(t *testing.T) {
	g := NewGovernor(StrategyRetry, Limits{RPM: 1})
	for range 100 {
		p, err := g.Acquire(context.Background(), Request{InputTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		p.Settle(Result{Class: Classification{Kind: KindRateLimit}})
	}
	if s := g.Snapshot(); s.Granted != 100 || s.RateLimited != 100 || s.Levels != nil {
		t.Fatalf("snapshot %+v", s)
	}
}

func TestGovernorSetLimitsKeepsDebt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGovernor(StrategyAuto, Limits{RPM: 600, TPM: 60_000, Warmup: -1, MaxConcurrency: 10})
		p, err := g.Acquire(t.Context(), Request{InputTokens: 1000, MaxTokens: 1000})
		if err != nil {
			t.Fatal(err)
		}
		before := g.Snapshot()
		g.SetLimits(Limits{RPM: 300, TPM: 30_000, Warmup: -1, MaxConcurrency: 5})
		s := g.Snapshot()
		// The request bucket keeps its level; the token log, whose limit
		// halved, keeps its bookings scaled with it: its level halves
		// (the reserve keeps its share of TPM).
		if s.Levels[DimRequests] != before.Levels[DimRequests] || s.Limits.RPM != 300 || s.Controller.Limit > 5 ||
			math.Abs(before.Levels[DimTokens]/2-s.Levels[DimTokens]) > 1e-6 || s.InFlightTokens != before.InFlightTokens {
			t.Fatalf("before %+v\nafter SetLimits: %+v", before, s)
		}
		p.Settle(Result{PromptTokens: 1000, CompletionTokens: 10})
		g.SetLimits(Limits{RPM: 300, Warmup: -1}) // TPM gone: rebuilt
		if _, ok := g.Snapshot().Levels[DimTokens]; ok {
			t.Fatal("tokens dimension still present")
		}
	})
}

func TestParseStrategy(t *testing.T) {
	for _, s := range Strategies {
		if got, err := ParseStrategy(string(s)); err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %q, %v", s, got, err)
		}
	}
	if got, _ := ParseStrategy(""); got != StrategyAuto {
		t.Errorf("empty = %q", got)
	}
	if _, err := ParseStrategy("fast"); err == nil {
		t.Error("want error for unknown strategy")
	}
}

// TestGovernorSettleFeedsBack: a 429 refunds the tokens, empties the named
// bucket and drains the controller; provider headers lower bucket levels;
// Penalize drains without a call of ours.
func TestGovernorSettleFeedsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGovernor(StrategyAuto, Limits{RPM: 600, TPM: 600_000, Warmup: -1, MaxConcurrency: 50})
		time.Sleep(time.Minute) // fill the (small) buckets
		p, err := g.Acquire(t.Context(), Request{InputTokens: 1000, MaxTokens: 1000})
		if err != nil {
			t.Fatal(err)
		}
		limit := g.Snapshot().ConcurrencyLimit
		p.Settle(Result{Class: Classify(429, nil, []byte(`{"code":"Throttling.AllocationQuota","message":"x"}`))})
		s := g.Snapshot()
		if s.Controller.State != StateDrain || s.ConcurrencyLimit >= limit || s.RateLimited != 1 {
			t.Fatalf("after 429: %+v", s)
		}
		if s.Levels[DimTokens] > 0 {
			t.Fatalf("tokens level %v after a TPM 429, want ≤ 0", s.Levels[DimTokens])
		}
		if s.InFlightTokens != 0 {
			t.Fatalf("in-flight tokens %v", s.InFlightTokens)
		}
		// Acquire waits out the cooldown, in virtual time.
		before := time.Now()
		p, err = g.Acquire(t.Context(), Request{InputTokens: 100, MaxTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(before) < autoCooldown {
			t.Fatalf("admitted %v after the 429, want after the %v cooldown", time.Since(before), autoCooldown)
		}
		time.Sleep(time.Minute)
		h := http.Header{}
		h.Set("X-Ratelimit-Remaining-Requests", "0")
		p.Settle(Result{PromptTokens: 100, CompletionTokens: 10, Latency: time.Second, Headers: h})
		if lvl := g.Snapshot().Levels[DimRequests]; lvl > 0 {
			t.Fatalf("requests level %v after remaining-requests 0", lvl)
		}
		cuts := g.Snapshot().Controller.Cuts
		g.Penalize(Classification{Kind: KindRateLimitRequests, RetryAfter: 3 * time.Second})
		g.Penalize(Classification{Kind: KindRateLimitRequests}) // same drain: no second cut
		if s := g.Snapshot(); s.Controller.Cuts != cuts+1 || s.Controller.State != StateDrain {
			t.Fatalf("penalize: cuts %d → %d, state %v", cuts, s.Controller.Cuts, s.Controller.State)
		}
	})
}

// TestGovernorSetLimitsConcurrently runs SetLimits against busy callers
// (for the race detector).
func TestGovernorSetLimitsConcurrently(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGovernor(StrategyAuto, Limits{RPM: 600, TPM: 100_000})
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				for {
					p, err := g.Acquire(ctx, Request{InputTokens: 100, MaxTokens: 50})
					if err != nil {
						return
					}
					time.Sleep(200 * time.Millisecond)
					p.Settle(Result{PromptTokens: 100, CompletionTokens: 40, Latency: 200 * time.Millisecond})
				}
			})
		}
		for i := range 20 {
			time.Sleep(time.Second)
			g.SetLimits(Limits{RPM: float64(300 + 30*i), TPM: 100_000, MaxConcurrency: 5 + i})
			_ = g.Snapshot()
		}
		wg.Wait()
	})
}

// TestAutoWaitingCallGoesWhenRoomIsFreed: a call waiting for the pacer gap
// and the log room that an earlier call's booking took goes as soon as that
// call settles shorter than booked, not when the booking would have left.
func TestAutoWaitingCallGoesWhenRoomIsFreed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		g := NewGovernor(StrategyAuto, Limits{TPM: 6000})
		req := Request{InputTokens: 100, MaxTokens: 2000}
		a, err := g.Acquire(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		sent := make(chan time.Time)
		go func() {
			b, err := g.Acquire(t.Context(), req)
			if err != nil {
				t.Error(err)
				close(sent)
				return
			}
			sent <- b.SentAt()
		}()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if lvl := g.Snapshot().Levels[DimTokens]; lvl >= 0 {
			t.Fatalf("the second call should be waiting for room (token level %.0f)", lvl)
		}
		a.Settle(Result{PromptTokens: 100, CompletionTokens: 50, Latency: 2 * time.Second})
		at := <-sent
		// booked 2,100 each against a cold limit of half of 6,000: without
		// the wake-up the second call waits 42 s for its pacer gap and 60 s
		// for the first booking to leave the window
		if d := at.Sub(t0); d > 5*time.Second {
			t.Fatalf("second call sent %v after the start, want within 5s of the first settling short", d)
		}
	})
}

// TestAutoTokenRateLimitCutsOnlyWhenUnforeseen: a token 429 while the log
// held the minute near TPM corrects the log and keeps the send rate; one
// while the log held little means the provider's limit is lower than
// configured, and the rate is cut.
func TestAutoTokenRateLimitCutsOnlyWhenUnforeseen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		limit429 := Result{Class: Classification{Kind: KindRateLimitTokens, Status: 429}}
		for _, tc := range []struct {
			name    string
			fill    float64 // share of the log's room the calls before take
			wantCut bool
		}{{"near full", 1, false}, {"nearly empty", 0.5, true}} {
			g := NewGovernor(StrategyAuto, Limits{TPM: 40_000})
			req := Request{InputTokens: 900, MaxTokens: 100}
			room := g.Snapshot().Levels[DimTokens]
			var last *Permit
			for {
				p, err := g.Acquire(t.Context(), req)
				if err != nil {
					t.Fatal(err)
				}
				last = p
				if g.Snapshot().Levels[DimTokens] < room*(1-tc.fill)+p.BookedTokens() {
					break
				}
				p.Settle(Result{PromptTokens: 900, CompletionTokens: 100, Latency: time.Second})
			}
			last.Settle(limit429)
			scale := g.pl.Load().rcap.Scale(time.Now())
			if cut := scale < 1; cut != tc.wantCut {
				t.Errorf("%s (%.0f%% of TPM booked): rate scale %.2f after a token 429, want cut %v",
					tc.name, 100*(40_000-g.Snapshot().Levels[DimTokens])/40_000, scale, tc.wantCut)
			}
		}
	})
}

// TestAutoPacesPerSecondLimitsWithAGuard: auto leaves 5 ms of each second
// unused (the lateness its pacer makes up), and 10 ms more where a
// per-second request limit binds (sends reach the provider with jitter);
// the guide's shaping paces at the limit (docs/design.md#pacer).
func TestAutoPacesPerSecondLimitsWithAGuard(t *testing.T) {
	for _, tc := range []struct {
		s    Strategy
		lim  Limits
		want time.Duration
	}{
		{StrategyAuto, Limits{RPS: 20}, 50750 * time.Microsecond},
		{StrategyAuto, Limits{RPM: 6000, RPS: 20}, 50750 * time.Microsecond},
		{StrategyAuto, Limits{RPM: 600, RPS: 20}, 100500 * time.Microsecond}, // RPM binds
		{StrategyShaping, Limits{RPS: 20}, 50 * time.Millisecond},
	} {
		if got := NewGovernor(tc.s, tc.lim).Snapshot().PacerInterval; got != tc.want {
			t.Errorf("%s %+v: pacer interval %v, want %v", tc.s, tc.lim, got, tc.want)
		}
	}
}
