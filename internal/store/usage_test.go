package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// allTime covers every hour a test writes.
func allTime(f store.UsageFilter) store.UsageFilter {
	f.From, f.To = time.Now().Add(-72*time.Hour), time.Now().Add(72*time.Hour)
	return f
}

// usageOf sums the rollup by tenant and model.
func usageOf(t testing.TB, s *store.Store) map[string]store.UsageRow {
	t.Helper()
	rows, err := s.Usage(context.Background(), allTime(store.UsageFilter{ByTenant: true}))
	require.NoError(t, err)
	out := map[string]store.UsageRow{}
	for _, r := range rows {
		out[r.Tenant+"/"+r.Model] = r
	}
	return out
}

// requireUsageMatchesJobs asserts the rollup equals the job rows under
// every grouping.
func requireUsageMatchesJobs(t testing.TB, s *store.Store) {
	t.Helper()
	ctx := context.Background()
	for _, f := range []store.UsageFilter{{}, {ByTenant: true}, {Period: store.PeriodHour}, {ByTenant: true, Period: store.PeriodDay}} {
		got, err := s.Usage(ctx, allTime(f))
		require.NoError(t, err)
		want, err := s.UsageOfJobs(ctx, allTime(f))
		require.NoError(t, err)
		require.Equal(t, want, got, "grouping %+v", f)
	}
}

func callErr(call, model string) store.AttemptError {
	return store.AttemptError{Model: model, Kind: call, Message: call, At: time.Now(), Call: call}
}

// Every transition that records a provider answer adds it to usage, in the
// hour the job row gives it; a failure decided without a call and a
// transition whose claim was lost add nothing.
func TestUsageRecordedByEveryTransition(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	claim := func(tenant, id string) store.Attempt {
		return insertClaimed(t, s, sampleJob(tenant, id), "w1", time.Minute).AttemptOf("w1")
	}
	type step struct {
		name string
		run  func() (bool, error)
	}
	yesterday := time.Now().Add(-25 * time.Hour)
	old := callErr(store.CallFailed, "qwen-plus")
	old.At = yesterday
	steps := []step{
		{"Complete", func() (bool, error) { return s.Complete(ctx, claim("a", "c1"), result()) }},
		{"Fail", func() (bool, error) { return s.Fail(ctx, claim("a", "f1"), callErr(store.CallFailed, "qwen-plus")) }},
		{"ScheduleRetry", func() (bool, error) {
			return s.ScheduleRetry(ctx, claim("a", "r1"), time.Now(), callErr(store.CallFailed, "qwen-plus"))
		}},
		{"ScheduleRetry yesterday", func() (bool, error) { return s.ScheduleRetry(ctx, claim("a", "r2"), time.Now(), old) }},
		{"DeferRateLimited", func() (bool, error) {
			return s.DeferRateLimited(ctx, claim("b", "d1"), time.Now(), callErr(store.CallRateLimited, "qwen-plus"))
		}},
		{"MarkDead", func() (bool, error) {
			return s.MarkDead(ctx, claim("b", "m1"), callErr(store.CallRateLimited, "qwen-flash"))
		}},
		{"MarkDeadLettered", func() (bool, error) {
			a := claim("b", "m2")
			return s.MarkDeadLettered(ctx, a, callErr(store.CallFailed, "qwen-flash"), store.DeadLetterRow{
				Tenant: "b", JobID: "m2", Lane: "normal", Reason: "attempts exhausted", Attempts: 1, Body: []byte(`{}`),
				FirstFailedAt: time.Now(), LastFailedAt: time.Now()})
		}},
		{"Fail without a call", func() (bool, error) { return s.Fail(ctx, claim("b", "n1"), attemptErr("invalid")) }},
		{"MarkDead without a call", func() (bool, error) { return s.MarkDead(ctx, claim("b", "n2"), attemptErr("deadline")) }},
	}
	for _, st := range steps {
		ok, err := st.run()
		require.NoError(t, err, st.name)
		require.True(t, ok, st.name)
	}
	// Lost claims: the wrong owner records nothing, so usage counts nothing.
	lost := store.Attempt{Key: job.Key{Tenant: "a", ID: "lost"}, Owner: "w2", N: 1}
	insertClaimed(t, s, sampleJob("a", "lost"), "w1", time.Minute)
	for _, run := range []func() (bool, error){
		func() (bool, error) { return s.Complete(ctx, lost, result()) },
		func() (bool, error) { return s.Fail(ctx, lost, callErr(store.CallFailed, "qwen-plus")) },
		func() (bool, error) {
			return s.DeferRateLimited(ctx, lost, time.Now(), callErr(store.CallRateLimited, "qwen-plus"))
		},
	} {
		ok, err := run()
		require.NoError(t, err)
		require.False(t, ok)
	}
	oks, err := s.CompleteBatch(ctx, []store.Completion{{Attempt: lost, Result: result()}})
	require.NoError(t, err)
	require.Equal(t, []bool{false}, oks)

	got := usageOf(t, s)
	require.Equal(t, map[string]store.UsageRow{
		"a/qwen-plus":  {Tenant: "a", Model: "qwen-plus", Calls: 4, InputTokens: 10, OutputTokens: 5, Failed: 3},
		"b/qwen-plus":  {Tenant: "b", Model: "qwen-plus", Calls: 1, RateLimited: 1},
		"b/qwen-flash": {Tenant: "b", Model: "qwen-flash", Calls: 2, RateLimited: 1, Failed: 1},
	}, got)
	requireUsageMatchesJobs(t, s)

	// Yesterday's call is in yesterday's hour, and outside a range that
	// starts today.
	hours, err := s.Usage(ctx, allTime(store.UsageFilter{Period: store.PeriodHour, OnlyTenant: "a"}))
	require.NoError(t, err)
	require.Equal(t, yesterday.UTC().Truncate(time.Hour), hours[0].Start)
	require.EqualValues(t, 1, hours[0].Calls)
	recent, err := s.Usage(ctx, store.UsageFilter{From: time.Now().Add(-2 * time.Hour), To: time.Now().Add(time.Hour), OnlyTenant: "a"})
	require.NoError(t, err)
	require.Len(t, recent, 1)
	require.EqualValues(t, 3, recent[0].Calls)
}

// CompleteBatch adds each tenant and model of a batch, counting a repeated
// item once, and concurrent batches on several connections add up.
func TestUsageCompleteBatchConcurrent(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	const writers, perBatch, batches = 4, 20, 5
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("w%d", w)
			for b := range batches {
				var items []store.Completion
				for i := range perBatch {
					j := sampleJob([]string{"a", "b"}[i%2], fmt.Sprintf("%s-%d-%d", owner, b, i))
					mustInsert(t, s, j)
					c, err := s.Claim(ctx, j.Key(), owner, time.Minute)
					if err != nil {
						errs <- err
						return
					}
					r := result()
					r.ModelUsed = []string{"qwen-plus", "qwen-flash"}[i%3%2]
					r.PromptTokens, r.CompletionTokens = i, 2*i
					items = append(items, store.Completion{Attempt: c.AttemptOf(owner), Result: r})
				}
				items = append(items, items[0]) // a repeated item is stored once
				oks, err := s.CompleteBatch(ctx, items)
				if err != nil {
					errs <- err
					return
				}
				if oks[len(oks)-1] {
					errs <- fmt.Errorf("repeated item stored twice")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var calls, in, out int64
	for _, r := range usageOf(t, s) {
		calls, in, out = calls+r.Calls, in+r.InputTokens, out+r.OutputTokens
	}
	require.EqualValues(t, writers*batches*perBatch, calls)
	require.EqualValues(t, writers*batches*(perBatch*(perBatch-1)/2), in)
	require.EqualValues(t, 2*in, out)
	requireUsageMatchesJobs(t, s)
}

// The rollup is written by the statement that records the outcome: when
// the usage write fails, the job keeps its claim and nothing is counted.
func TestUsageFailureLeavesTheJobUnchanged(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `ALTER TABLE usage_hours ADD CONSTRAINT refuse CHECK (calls < 0)`)
	require.NoError(t, err)
	a := insertClaimed(t, s, sampleJob("a", "x"), "w1", time.Minute).AttemptOf("w1")
	_, err = s.CompleteBatch(ctx, []store.Completion{{Attempt: a, Result: result()}})
	require.Error(t, err)
	_, err = s.DeferRateLimited(ctx, a, time.Now(), callErr(store.CallRateLimited, "qwen-plus"))
	require.Error(t, err)
	_, err = s.MarkDeadLettered(ctx, a, callErr(store.CallFailed, "qwen-plus"), store.DeadLetterRow{
		Tenant: "a", JobID: "x", Lane: "normal", Reason: "r", Body: []byte(`{}`), FirstFailedAt: time.Now(), LastFailedAt: time.Now()})
	require.Error(t, err)
	rec := mustGet(t, s, a.Key)
	require.Equal(t, job.StatusRunning, rec.Status)
	require.Empty(t, rec.Errors)
	require.Empty(t, deadLetters(t, s, "a"))
	// A failure without a call writes no usage, so it goes through.
	ok, err := s.Fail(ctx, a, attemptErr("invalid"))
	require.NoError(t, err)
	require.True(t, ok)
}
