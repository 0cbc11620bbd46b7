package replicastat_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/llmq/llmq/internal/quota"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/ratecontrol/flow"
	"github.com/llmq/llmq/internal/replicastat"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// fakeGovernor returns the snapshot the test sets.
type fakeGovernor struct {
	mu sync.Mutex
	s  ratecontrol.Snapshot
}

func (g *fakeGovernor) Snapshot() ratecontrol.Snapshot {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.s
}

func (g *fakeGovernor) set(s ratecontrol.Snapshot) {
	g.mu.Lock()
	g.s = s
	g.mu.Unlock()
}

// TestCollectMeasuresRates: the rates are the counters' growth over the
// time between two collections; the limits, state, calibration, share and
// waiting jobs are copied as they are.
func TestCollectMeasuresRates(t *testing.T) {
	t.Parallel()
	gov := &fakeGovernor{}
	gov.set(ratecontrol.Snapshot{Strategy: ratecontrol.StrategyAuto, Granted: 100, Booked: 20_000, RateLimited: 1})
	now := time.Unix(1_000_000, 0)
	r := replicastat.New(replicastat.Params{
		ReplicaID: "r1", Models: map[string]config.Model{"m": {RPM: 1200, TPS: 2500}},
		Governors: map[string]replicastat.Governor{"m": gov},
		Waiting:   func() map[string]int { return map[string]int{"m": 7} },
		Shares:    func() map[string]quota.Share { return map[string]quota.Share{"m": {Requests: 0.5, Tokens: 0.25}} },
		Now:       func() time.Time { return now },
	})
	first := r.Collect()
	require.Len(t, first, 1)
	assert.Zero(t, first[0].RequestsPerSec, "no rate before a second reading")

	now = now.Add(2 * time.Second)
	gov.set(ratecontrol.Snapshot{Strategy: ratecontrol.StrategyAuto, Granted: 110, Booked: 24_000, RateLimited: 3,
		Limits:      ratecontrol.Limits{RPM: 600, TPS: 1250},
		Controller:  &flow.ControllerSnapshot{State: ratecontrol.StateDrain},
		Calibration: flow.CalibrationSnapshot{InputRatio: 1.2, OutputMean: 180, Samples: 40}, InFlight: 4, ConcurrencyLimit: 8})
	rows := r.Collect()
	require.Len(t, rows, 1)
	row := rows[0]
	assert.InDelta(t, 5, row.RequestsPerSec, 1e-9)
	assert.InDelta(t, 2000, row.TokensPerSec, 1e-9)
	assert.InDelta(t, 1, row.RateLimitedPerSec, 1e-9)
	assert.EqualValues(t, 3, row.RateLimitedTotal)
	assert.Equal(t, "drain", row.ControllerState)
	assert.EqualValues(t, 1200, row.RPMLimit)
	assert.EqualValues(t, 150_000, row.TPMLimit, "tps × 60")
	assert.EqualValues(t, 600, row.AppliedRPM)
	assert.InDelta(t, 1.2, row.InputRatio, 1e-9)
	assert.Equal(t, 7, row.Waiting)
	assert.Equal(t, 4, row.InFlight)
	require.NotNil(t, row.ShareRequests)
	assert.InDelta(t, 0.5, *row.ShareRequests, 1e-9)
	assert.InDelta(t, 0.25, *row.ShareTokens, 1e-9)
}

// TestRunWritesThenForgets: a running reporter keeps its rows in
// Postgres; stopped, it deletes them, so the overview drops the replica
// at once.
func TestRunWritesThenForgets(t *testing.T) {
	t.Parallel()
	st := store.New(testsvc.Postgres(t))
	gov := &fakeGovernor{}
	gov.set(ratecontrol.Snapshot{Strategy: ratecontrol.StrategyAuto})
	r := replicastat.New(replicastat.Params{Store: st, ReplicaID: "r1",
		Governors: map[string]replicastat.Governor{"a": gov, "b": gov}, Interval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()

	deadline := time.Now().Add(10 * time.Second)
	var rows []store.ReplicaSnapshot
	for len(rows) < 2 {
		require.True(t, time.Now().Before(deadline), "the reporter wrote no rows")
		var err error
		rows, err = st.ReplicaSnapshots(context.Background(), time.Minute)
		require.NoError(t, err)
	}
	assert.Equal(t, []string{"a", "b"}, []string{rows[0].Model, rows[1].Model})
	cancel()
	<-done
	rows, err := st.ReplicaSnapshots(context.Background(), time.Hour)
	require.NoError(t, err)
	assert.Empty(t, rows, "a replica that stops deletes its rows")
}
