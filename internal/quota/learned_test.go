package quota

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/testsvc"
)

// warmCalibration is what a replica learns after 300 settled calls of a
// mix of short and long answers.
func warmCalibration() ratecontrol.Calibration {
	cal := ratecontrol.Calibration{InputRatio: 1.25, RatioSamples: 300, Samples: 300, OutputDev: 250,
		EstimateBias: 0.05, EstimateError: 0.2, EstimateSample: 300}
	for i := range fullWindow {
		out := 30.0
		if i%3 == 0 {
			out = 600
		}
		cal.Outputs = append(cal.Outputs, out)
		cal.Latencies = append(cal.Latencies, 0.03+out*0.0002)
	}
	return cal
}

// recordingGov is a real governor that records whether it was still paused
// when it adopted the others' learned state.
type recordingGov struct {
	*ratecontrol.Governor
	mu             sync.Mutex
	adoptedPaused  []bool
	positiveLimits bool
	warmth         float64 // reported instead of the governor's own when > 0
}

func (g *recordingGov) Learned() ratecontrol.Learned {
	l := g.Governor.Learned()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.warmth > 0 {
		l.Warmth = g.warmth
	}
	return l
}

func (g *recordingGov) SetLimits(l ratecontrol.Limits) {
	g.mu.Lock()
	g.positiveLimits = l.RPM > 1e-3
	g.mu.Unlock()
	g.Governor.SetLimits(l)
}

func (g *recordingGov) Adopt(l ratecontrol.Learned) (bool, bool, bool) {
	g.mu.Lock()
	g.adoptedPaused = append(g.adoptedPaused, !g.positiveLimits)
	g.mu.Unlock()
	return g.Governor.Adopt(l)
}

// TestJoiningReplicaStartsFromOthersCalibration: a replica's learned
// calibration, rate cap and warm-up progress reach Postgres with its lease;
// a replica joining adopts them in its first round, before its governor has
// a share to send with; a rate cap or a warmth from a row older than a
// lease is not taken, and a row older than learnedKeep offers nothing.
func TestJoiningReplicaStartsFromOthersCalibration(t *testing.T) {
	t.Parallel()
	pool := testsvc.Postgres(t)
	ctx := context.Background()
	m := config.Model{RPM: 1200, TPM: 600000, MaxConcurrency: 30, Warmup: 30 * time.Second}
	join := func(id string) (*Coordinator, *recordingGov, Report) {
		g := &recordingGov{Governor: ratecontrol.NewGovernor(ratecontrol.StrategyAuto, Limits(m, Share{Requests: 1, Tokens: 1}))}
		c := New(pool, id, map[string]config.Model{model: m}, func(string) Governor { return g }, q, WithDemand(full))
		rep := c.tick(ctx)
		require.NoError(t, rep.Err)
		return c, g, rep
	}

	// a: warm, its rate cut to 0.6 of the configured rate.
	a, ga, rep := join("a")
	require.Nil(t, rep.Models[model].Adopted, "nothing to adopt when alone")
	cal, rate, _ := ga.Governor.Adopt(ratecontrol.Learned{Calibration: warmCalibration(), RateScale: 0.6})
	require.True(t, cal && rate)
	ga.mu.Lock()
	ga.warmth = 0.7 // 21 s into its 30 s warm-up
	ga.mu.Unlock()
	require.NoError(t, a.tick(ctx).Err)
	var samples int
	var scale, warmth float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT samples, rate_scale, warmth FROM quota_learned WHERE model = $1 AND replica_id = 'a'`, model).Scan(&samples, &scale, &warmth))
	require.Equal(t, 300, samples)
	require.InDelta(t, 0.6, scale, 0.02)
	require.Equal(t, 0.7, warmth)

	// b joins: it starts from a's calibration and rate cap, while paused.
	b, gb, rep := join("b")
	ad := rep.Models[model].Adopted
	require.NotNil(t, ad)
	require.Equal(t, "a", ad.From)
	require.True(t, ad.Calibration, "calibration adopted")
	require.True(t, ad.Rate, "rate cap adopted")
	require.True(t, ad.Warm, "warm-up progress adopted")
	require.Equal(t, 0.7, ad.Warmth)
	require.Equal(t, []bool{true}, gb.adoptedPaused, "adopted before any share")
	wa, wb := ga.Snapshot().Calibration, gb.Snapshot().Calibration
	require.Equal(t, wa.Samples, wb.Samples)
	require.InDelta(t, wa.OutputMean, wb.OutputMean, 1e-9)
	require.InDelta(t, wa.InputRatio, wb.InputRatio, 1e-9)
	require.Less(t, gb.Learned().RateScale, 0.65)

	// Only the first round adopts.
	rep = b.tick(ctx)
	require.NoError(t, rep.Err)
	require.Nil(t, rep.Models[model].Adopted)

	// Rows older than a lease: the calibration still helps, the rate cap
	// is history (a replica that stopped is not cut any more).
	_, err := pool.Exec(ctx, `UPDATE quota_learned SET updated_at = now() - interval '1 minute'`)
	require.NoError(t, err)
	_, gc, rep := join("c")
	ad = rep.Models[model].Adopted
	require.NotNil(t, ad)
	require.True(t, ad.Calibration)
	require.False(t, ad.Rate)
	require.Equal(t, 1.0, ad.RateScale)
	require.False(t, ad.Warm, "a warmth older than a lease is history")
	require.Zero(t, ad.Warmth)
	require.InDelta(t, 1.0, gc.Learned().RateScale, 1e-9)

	// Rows older than learnedKeep offer nothing.
	_, err = pool.Exec(ctx, `UPDATE quota_learned SET updated_at = now() - interval '2 hours'`)
	require.NoError(t, err)
	_, gd, rep := join("d")
	require.Nil(t, rep.Models[model].Adopted)
	require.Zero(t, gd.Snapshot().Calibration.Samples)
}
