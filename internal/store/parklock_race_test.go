package store_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
)

// TestSettledClaimsNotHeldByAnotherLock: a row lock that a lock query
// takes on a row another transaction changed after the query's snapshot
// outlives the query even though the row no longer qualifies (Postgres locks
// the newest version, then drops the row on the re-check). A settle that
// committed claims while a second lock of the group was being taken so
// left claimed rows locked by that second lock, and their completions
// waited for it to end (up to worker.store_delay). One store serializes
// its lock queries and settle commits per group; this test settles claims
// while another lock of the group is taken over and over, and checks after
// each settle that no claimed row is locked.
func TestSettledClaimsNotHeldByAnotherLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	const n, batch = 6000, 15
	for from := 0; from < n; from += 500 {
		jobs := make([]job.Job, 500)
		keys := make([]job.Key, 500)
		for i := range jobs {
			jobs[i] = sampleJob("flood", fmt.Sprintf("r%05d", from+i))
			keys[i] = jobs[i].Key()
		}
		_, err := s.InsertBatch(ctx, jobs)
		require.NoError(t, err)
		_, err = s.Park(ctx, keys)
		require.NoError(t, err)
	}

	stop := make(chan struct{})
	var other sync.WaitGroup
	var otherLocks atomic.Int64
	for range 2 {
		other.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := s.LockParked(ctx, floodGroup, batch, "other", time.Minute)
				if !assert.NoError(t, err) {
					return
				}
				if l == nil {
					continue
				}
				otherLocks.Add(1)
				time.Sleep(2 * time.Millisecond) // a batch runs a while before it settles
				if !assert.NoError(t, s.ReleaseParked(ctx, l)) {
					return
				}
			}
		})
	}
	defer func() { close(stop); other.Wait() }()

	var settles, held int
	for settles < n/batch/2 {
		l, err := s.LockParked(ctx, floodGroup, batch, "w1", time.Minute)
		require.NoError(t, err)
		if l == nil {
			continue // the others hold every parked row for the moment
		}
		claim := keysOf(l.Records())
		_, err = s.SettleParked(ctx, l, nil, claim)
		require.NoError(t, err)
		settles++
		tenants, ids := make([]string, len(claim)), make([]string, len(claim))
		for i, k := range claim {
			tenants[i], ids[i] = k.Tenant, k.ID
		}
		var free int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM jobs
			WHERE (tenant, id) IN (SELECT * FROM unnest($1::text[], $2::text[])) FOR UPDATE SKIP LOCKED) f`,
			tenants, ids).Scan(&free))
		held += len(claim) - free
	}
	t.Logf("%d settles, %d locks taken beside them", settles, otherLocks.Load())
	assert.Zero(t, held, "claimed rows still locked by another lock of the group right after the settle")
}
