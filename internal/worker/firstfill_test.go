package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
)

// A fresh replica reads a flood of a tenant at its cap off the intake: the
// tenant is not given the first fill (directFill), so its jobs, which wait
// for the cap without the model reading saturated (excess leaves them
// alone), hold what a group holds, not every max_in_flight slot, and
// another tenant's job that comes after the flood runs.
func TestCappedFloodLeavesRoomOnAFreshReplica(t *testing.T) {
	t.Parallel()
	const flood, slots = 200, 60
	cfgR, pub, sub := rabbitClients(t)
	h := newHarness(t, sim.Config{Models: map[string]sim.ModelConfig{"m": {}}}, map[string]config.Model{"m": {}})
	h.lanes = pub
	cfg := h.cfg
	cfg.MaxInFlight, cfg.TenantHold = slots, 2
	cfg.Tenants = map[string]config.TenantLimits{"capped": {RPM: 1}} // one call, then a minute's wait
	w, _ := h.start(sub, cfg)
	awaitAccepting(t, w)
	ing, err := ingest.New(ingest.Config{}, ingest.Deps{Store: h.store, Intake: intakeSubscriber(t, cfgR), Lanes: pub, Runner: w})
	require.NoError(t, err)
	ctx, stopIngest := context.WithCancel(context.Background())
	t.Cleanup(stopIngest)
	go func() { _ = ing.Run(ctx) }()

	publish := func(tenant, id string, i int) {
		body := jobBody(id, "m", i, map[string]any{"tenant": tenant})
		require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: body}))
	}
	for i := range flood {
		publish("capped", fmt.Sprintf("capped-%d", i), i)
	}
	require.Eventually(t, func() bool {
		return h.countJobs(t, "tenant = 'capped'") == flood
	}, time.Minute, 10*time.Millisecond, "the flood is stored")
	running := h.countJobs(t, "tenant = 'capped' AND status = 'running'")
	require.LessOrEqual(t, running, unsaturatedHolds*cfg.TenantHold,
		"the capped tenant holds what a group holds on a model that is not saturated, not every slot")
	publish("free", "free-1", 0)
	require.Eventually(t, func() bool {
		rec, err := h.store.Get(ctx, job.Key{Tenant: "free", ID: "free-1"})
		return err == nil && rec.Status == job.StatusSucceeded
	}, 20*time.Second, 20*time.Millisecond, "another tenant's job runs while the capped tenant waits for its cap")
}
