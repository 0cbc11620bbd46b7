package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

func TestListCursorPaginationReturnsEveryRowOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	// 57 jobs in one transaction share created_at, so the id breaks ties;
	// 20 more come later. Another tenant's jobs must never appear.
	_, err := pool.Exec(ctx, `INSERT INTO jobs (tenant, id, model, request)
		SELECT 'acme', 'bulk-' || lpad(g::text, 3, '0'), 'm', '{}' FROM generate_series(1, 57) g`)
	require.NoError(t, err)
	want := map[string]bool{}
	for i := range 57 {
		want[fmt.Sprintf("bulk-%03d", i+1)] = true
	}
	for i := range 20 {
		id := fmt.Sprintf("late-%02d", i)
		mustInsert(t, s, sampleJob("acme", id))
		mustInsert(t, s, sampleJob("globex", id))
		want[id] = true
		if i%4 == 0 {
			forceStatus(t, pool, job.Key{Tenant: "acme", ID: id}, job.StatusSucceeded)
		}
	}

	seen := map[string]int{}
	var prev *store.Record
	cursor, pages := "", 0
	for {
		recs, next, err := s.List(ctx, store.ListFilter{Tenant: "acme", Limit: 10, Cursor: cursor})
		require.NoError(t, err)
		pages++
		for i := range recs {
			r := recs[i]
			assert.Equal(t, "acme", r.Tenant)
			seen[r.ID]++
			if prev != nil {
				assert.True(t, prev.CreatedAt.Before(r.CreatedAt) || prev.CreatedAt.Equal(r.CreatedAt) && prev.ID < r.ID,
					"order (created_at, id): %s then %s", prev.ID, r.ID)
			}
			prev = &r
		}
		if next == "" {
			break
		}
		require.Len(t, recs, 10, "only the last page is short")
		cursor = next
	}
	assert.Equal(t, 8, pages)
	require.Len(t, seen, len(want))
	for id, n := range seen {
		assert.True(t, want[id], id)
		assert.Equal(t, 1, n, "%s seen %d times", id, n)
	}

	done, next, err := s.List(ctx, store.ListFilter{Tenant: "acme", Status: job.StatusSucceeded})
	require.NoError(t, err)
	assert.Empty(t, next)
	require.Len(t, done, 5)
	for _, r := range done {
		assert.Equal(t, job.StatusSucceeded, r.Status)
	}
	// A page boundary exactly at the end gives an empty next cursor.
	recs, next, err := s.List(ctx, store.ListFilter{Tenant: "acme", Status: job.StatusSucceeded, Limit: 5})
	require.NoError(t, err)
	assert.Len(t, recs, 5)
	assert.Empty(t, next)

	_, _, err = s.List(ctx, store.ListFilter{Tenant: "acme", Cursor: "not-a-cursor"})
	assert.ErrorIs(t, err, store.ErrBadCursor)
}
