package quota

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ratecontrol"
)

var testModel = config.Model{RPM: 6000, TPM: 600000, MaxConcurrency: 30}

func TestTarget(t *testing.T) {
	lim := 100.0 // RPM 6000 = 100/s
	tests := []struct {
		name    string
		demands []float64 // requests/s; tokens = ×100
		want    []float64
	}{
		{"alone", []float64{50}, []float64{1}},
		{"equal backlog", []float64{lim, lim, lim}, []float64{1. / 3, 1. / 3, 1. / 3}},
		{"demand above the limit is capped", []float64{10 * lim, lim}, []float64{0.5, 0.5}},
		{"demand-weighted", []float64{10, 30}, []float64{0.25, 0.75}},
		// floor = 5% × 100 / 2 = 2.5
		{"idle replica keeps the floor", []float64{0, lim}, []float64{2.5 / 102.5, 100 / 102.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ms []Member
			for i, d := range tt.demands {
				ms = append(ms, Member{ReplicaID: fmt.Sprint("r", i), Demand: Demand{d, d * 100}})
			}
			sum := 0.0
			for i, want := range tt.want {
				got := Target(fmt.Sprint("r", i), ms, testModel, DefaultFloor)
				require.InDelta(t, want, got.Requests, 1e-9, "replica %d requests", i)
				require.InDelta(t, want, got.Tokens, 1e-9, "replica %d tokens", i)
				sum += got.Requests
			}
			require.InDelta(t, 1, sum, 1e-9)
		})
	}
	require.Equal(t, Share{}, Target("absent", []Member{{ReplicaID: "r0"}}, testModel, DefaultFloor))
}

// TestNextKeepsInvariant drives random rounds of random replicas with
// random demands (each round sees the current published shares, as the
// lock makes it) and checks that the published shares never sum above 1,
// that a positive share never drops to 0, and that the shares converge to
// the targets once demand holds still.
func TestNextKeepsInvariant(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		n := 2 + rng.IntN(4)
		ms := make([]Member, n)
		for i := range ms {
			ms[i].ReplicaID = fmt.Sprint("r", i)
		}
		for step := range 60 {
			i := rng.IntN(n)
			if step < 40 { // demand moves; then it holds
				ms[i].Demand = Demand{rng.Float64() * 150, rng.Float64() * 15000}
			}
			target := Target(ms[i].ReplicaID, ms, testModel, DefaultFloor)
			cur := ms[i].Share
			nx := Next(ms[i].ReplicaID, ms, target, cur)
			if cur.Requests > 0 {
				require.Positive(t, nx.Requests)
			}
			ms[i].Share = nx
			var sr, st float64
			for _, m := range ms {
				sr += m.Share.Requests
				st += m.Share.Tokens
			}
			require.LessOrEqual(t, sr, 1.0, "trial %d step %d", trial, step)
			require.LessOrEqual(t, st, 1.0, "trial %d step %d", trial, step)
		}
		// Demand holds: a few rounds of everyone converge to the targets.
		for range 3 {
			for i := range ms {
				target := Target(ms[i].ReplicaID, ms, testModel, DefaultFloor)
				ms[i].Share = Next(ms[i].ReplicaID, ms, target, ms[i].Share)
			}
		}
		var sr float64
		for i := range ms {
			target := Target(ms[i].ReplicaID, ms, testModel, DefaultFloor)
			require.InDelta(t, target.Requests, ms[i].Share.Requests, 1e-6, "trial %d", trial)
			sr += ms[i].Share.Requests
		}
		require.InDelta(t, 1, sr, 1e-6, "the members use the whole quota")
	}
}

func TestNextNewcomerWaitsForRoom(t *testing.T) {
	ms := []Member{
		{ReplicaID: "a", Demand: Demand{100, 1e4}, Share: Share{1, 1}},
		{ReplicaID: "b", Demand: Demand{100, 1e4}},
	}
	target := Target("b", ms, testModel, DefaultFloor)
	require.InDelta(t, 0.5, target.Requests, 1e-9)
	require.Equal(t, Share{}, Next("b", ms, target, Share{}), "no room until a shrinks")
	ms[0].Share = Next("a", ms, Target("a", ms, testModel, DefaultFloor), ms[0].Share)
	require.InDelta(t, 0.5, ms[0].Share.Requests, 1e-9, "a shrinks at once")
	got := Next("b", ms, target, Share{})
	require.InDelta(t, 0.5, got.Requests, 1e-6, "then b takes the room")
}

func TestNextRecoversFromOvercommit(t *testing.T) {
	// b ran on a fallback share while a absorbed everything.
	ms := []Member{
		{ReplicaID: "a", Demand: Demand{100, 1e4}, Share: Share{1, 1}},
		{ReplicaID: "b", Demand: Demand{100, 1e4}, Share: Share{0.25, 0.25}},
	}
	b := Next("b", ms, Target("b", ms, testModel, DefaultFloor), ms[1].Share)
	require.Equal(t, Share{0.25, 0.25}, b, "b keeps a positive share, no larger")
	a := Next("a", ms, Target("a", ms, testModel, DefaultFloor), ms[0].Share)
	require.InDelta(t, 0.5, a.Requests, 1e-9, "a shrinks to its target")
	ms[0].Share = a
	b = Next("b", ms, Target("b", ms, testModel, DefaultFloor), b)
	require.InDelta(t, 0.5, b.Requests, 1e-6)
}

func TestLimits(t *testing.T) {
	m := config.Model{RPM: 1200, TPM: 90000, TPS: 3000, MaxConcurrency: 20, Warmup: -1}
	got := Limits(m, Share{Requests: 0.5, Tokens: 0.25})
	require.Equal(t, ratecontrol.Limits{RPM: 600, TPM: 22500, TPS: 750, MaxConcurrency: 10, Warmup: -1}, got)

	paused := Limits(m, Share{})
	require.Positive(t, paused.RPM, "0 would mean no limit")
	require.Less(t, paused.RPM, 1e-3)
	require.Zero(t, paused.RPS, "an unlimited dimension stays unlimited")
	require.Equal(t, 20, paused.MaxConcurrency, "paused: slots kept, the rates admit nothing")

	// Concurrency shares never sum above the total when there are slots enough.
	sum := 0
	for _, s := range []float64{1. / 3, 1. / 3, 1 - 2./3 - shareEpsilon} {
		sum += Limits(m, Share{s, s}).MaxConcurrency
	}
	require.LessOrEqual(t, sum, 20)
	require.False(t, math.IsNaN(Limits(m, Share{1, 1}).RPM))
}
