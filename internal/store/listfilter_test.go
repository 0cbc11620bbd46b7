package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// withFilter is f changed by edit.
func withFilter(f store.ListFilter, edit func(*store.ListFilter)) store.ListFilter {
	edit(&f)
	return f
}

// listIDs pages through f with page size 3 and returns "tenant/id" of
// every job in order.
func listIDs(t *testing.T, s *store.Store, f store.ListFilter) []string {
	t.Helper()
	f.Limit = 3
	var out []string
	for pages := 0; ; pages++ {
		require.Less(t, pages, 100, "paging does not end")
		recs, next, err := s.List(context.Background(), f)
		require.NoError(t, err)
		for _, r := range recs {
			out = append(out, r.Tenant+"/"+r.ID)
		}
		if next == "" {
			return out
		}
		f.Cursor = next
	}
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	// Jobs one second apart, in the order listed.
	jobs := []struct {
		tenant, id, model, meta string
		status                  job.Status
	}{
		{"acme", "a1", "qwen-plus", `{"ticket": 1, "source": "mail"}`, job.StatusSucceeded},
		{"globex", "g1", "qwen-plus", `{"source": "chat"}`, job.StatusQueued},
		{"acme", "a2", "qwen-max", `{"ticket": "2", "source": "chat"}`, job.StatusDead},
		{"acme", "a3", "qwen-plus", ``, job.StatusQueued},
		{"globex", "a1", "qwen-max", `{"ticket": 1}`, job.StatusSucceeded},
		{"acme", "a4", "qwen-max", `{"source": "mail"}`, job.StatusSucceeded},
	}
	base := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	for i, j := range jobs {
		sj := sampleJob(j.tenant, j.id)
		sj.Model, sj.Metadata = j.model, json.RawMessage(j.meta)
		mustInsert(t, s, sj)
		if j.status != job.StatusQueued {
			forceStatus(t, pool, sj.Key(), j.status)
		}
		_, err := pool.Exec(ctx, `UPDATE jobs SET created_at = $3 WHERE tenant = $1 AND id = $2`,
			j.tenant, j.id, base.Add(time.Duration(i)*time.Second))
		require.NoError(t, err)
	}
	acme := store.ListFilter{Tenant: "acme"}
	all := store.ListFilter{AllTenants: true}
	with := withFilter
	cases := []struct {
		name string
		f    store.ListFilter
		want []string
	}{
		{"tenant", acme, []string{"acme/a1", "acme/a2", "acme/a3", "acme/a4"}},
		{"every tenant", all, []string{"acme/a1", "globex/g1", "acme/a2", "acme/a3", "globex/a1", "acme/a4"}},
		{"newest first", with(all, func(f *store.ListFilter) { f.Desc = true }),
			[]string{"acme/a4", "globex/a1", "acme/a3", "acme/a2", "globex/g1", "acme/a1"}},
		{"status", with(all, func(f *store.ListFilter) { f.Status = job.StatusSucceeded }), []string{"acme/a1", "globex/a1", "acme/a4"}},
		{"model", with(acme, func(f *store.ListFilter) { f.Model = "qwen-max" }), []string{"acme/a2", "acme/a4"}},
		{"metadata", with(all, func(f *store.ListFilter) { f.Metadata = []json.RawMessage{json.RawMessage(`{"source": "chat"}`)} }),
			[]string{"globex/g1", "acme/a2"}},
		{"metadata any of", with(all, func(f *store.ListFilter) {
			f.Metadata = []json.RawMessage{json.RawMessage(`{"ticket": "1"}`), json.RawMessage(`{"ticket": 1}`)}
		}), []string{"acme/a1", "globex/a1"}},
		{"created range", with(all, func(f *store.ListFilter) {
			f.CreatedAfter, f.CreatedBefore = base.Add(time.Second), base.Add(4*time.Second)
		}), []string{"globex/g1", "acme/a2", "acme/a3"}},
		{"id in every tenant", with(all, func(f *store.ListFilter) { f.ID = "a1" }), []string{"acme/a1", "globex/a1"}},
		{"id in a tenant", with(acme, func(f *store.ListFilter) { f.ID = "g1" }), nil},
		{"all at once", with(all, func(f *store.ListFilter) {
			f.Status, f.Model, f.Desc = job.StatusSucceeded, "qwen-max", true
			f.Metadata = []json.RawMessage{json.RawMessage(`{"source": "mail"}`)}
		}), []string{"acme/a4"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, listIDs(t, s, c.f))
		})
	}

	t.Run("a cursor keeps its direction", func(t *testing.T) {
		_, next, err := s.List(ctx, store.ListFilter{AllTenants: true, Limit: 1})
		require.NoError(t, err)
		require.NotEmpty(t, next)
		_, _, err = s.List(ctx, store.ListFilter{AllTenants: true, Limit: 1, Desc: true, Cursor: next})
		assert.ErrorIs(t, err, store.ErrBadCursor)
	})
}

func TestListEveryTenantOfAnEmptyTable(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	recs, next, err := s.List(context.Background(), store.ListFilter{AllTenants: true})
	require.NoError(t, err)
	assert.Empty(t, recs)
	assert.Empty(t, next)
}

func TestFindDeadLettersFilters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	base := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	letters := []struct {
		tenant, id, model, reason string
	}{
		{"acme", "d1", "qwen-plus", "attempts exhausted"},
		{"acme", "d2", "qwen-max", "deadline passed"},
		{"globex", "d3", "qwen-max", "attempts exhausted"},
		{"acme", "", "", "unreadable"},
	}
	for i, l := range letters {
		if l.id != "" {
			j := sampleJob(l.tenant, l.id)
			j.Model = l.model
			mustInsert(t, s, j)
		}
		at := base.Add(time.Duration(i) * time.Minute)
		_, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Tenant: l.tenant, JobID: l.id, Lane: "normal", Reason: l.reason,
			Body: []byte(`{}`), FirstFailedAt: at, LastFailedAt: at})
		require.NoError(t, err)
	}
	ids := func(f store.DeadLetterFilter) []string {
		f.Limit = 1
		var out []string
		for {
			page, next, err := s.FindDeadLetters(ctx, f)
			require.NoError(t, err)
			for _, d := range page {
				out = append(out, d.Tenant+"/"+d.JobID)
			}
			if next == "" {
				break
			}
			f.Cursor = next
		}
		n, err := s.CountDeadLetters(ctx, f)
		require.NoError(t, err)
		assert.EqualValues(t, len(out), n, "count agrees with the list")
		return out
	}
	assert.Equal(t, []string{"acme/d1", "acme/d2", "acme/"}, ids(store.DeadLetterFilter{Tenant: "acme"}))
	assert.Equal(t, []string{"acme/d1", "globex/d3"}, ids(store.DeadLetterFilter{AllTenants: true, Reason: "attempts exhausted"}))
	assert.Equal(t, []string{"acme/d2", "globex/d3"}, ids(store.DeadLetterFilter{AllTenants: true, Model: "qwen-max"}))
	assert.Equal(t, []string{"acme/d2", "globex/d3"}, ids(store.DeadLetterFilter{AllTenants: true,
		FailedAfter: base.Add(time.Minute), FailedBefore: base.Add(3 * time.Minute)}))
	assert.Equal(t, []string{"acme/d2"}, ids(store.DeadLetterFilter{Tenant: "acme", Model: "qwen-max"}))
}
