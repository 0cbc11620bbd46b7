package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/testsvc"
)

// TestReplicasDefaultConfig: three consumer replicas built as `consumer
// run` builds them, from a config that says nothing of the quota, share
// one model's quota against llmsim: no sliding minute over the quota
// (llmsim's referee), at most 0.5% of calls answered 429 over the whole
// run, warm-up included; a replica that replaces one of them starts from
// their calibration. Goodput is `llmq replicas`' table, not asserted here.
func TestReplicasDefaultConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("about 80 s of real time: not in -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := runReplicas(ctx, replicasPlan{
		Replicas: 3, Minutes: 1, Settle: 5 * time.Second, Restart: true, Joined: 10 * time.Second,
		RPM: 1200, TPM: 150_000, DatabaseURL: testsvc.PostgresURL(t),
	})
	require.NoError(t, err)
	share := float64(res.RateLimited) / float64(max(res.Requests, 1))
	t.Logf("calls %d, 429s %d (%.2f%%), sliding-minute max %d tokens %d requests, overruns %v, goodput %.1f%% of %s, newcomer %+v",
		res.Requests, res.RateLimited, 100*share, res.SlidingTokens, res.SlidingRequests, res.Overruns, 100*res.Goodput, res.Binding, *res.Restart)

	require.True(t, res.Shared, "quota.shared is the default")
	require.Greater(t, res.Requests, int64(300), "the replicas sent calls")
	for reason, n := range res.Overruns {
		require.Zero(t, n, "sliding-window overruns of %s", reason)
	}
	require.LessOrEqual(t, res.SlidingTokens, int64(150_000))
	require.LessOrEqual(t, res.SlidingRequests, int64(1200))
	require.LessOrEqual(t, share, 0.005, "429 share")
	require.NotNil(t, res.Restart)
	require.True(t, res.Restart.Adopted, "the newcomer started from the others' calibration")
}
