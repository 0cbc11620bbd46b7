package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// A tenant of weight 2 gets two of every three picks against a tenant of
// weight 1 while both have jobs, however many more jobs the other has.
func TestFairQueueTenantWeights(t *testing.T) {
	q := newFairQueue(6, 3, 1)
	q.weight = func(tenant string) float64 {
		if tenant == "gold" {
			return 2
		}
		return 1
	}
	for i := range 300 {
		q.Push(tk(job.PriorityNormal, "flood", fmt.Sprint("f", i)))
	}
	for i := range 100 {
		q.Push(tk(job.PriorityNormal, "gold", fmt.Sprint("g", i)))
	}
	counts := map[string]int{}
	for range 150 {
		counts[q.Pop().job.Tenant]++
	}
	require.Equal(t, map[string]int{"gold": 100, "flood": 50}, counts)
	// With gold drained the flood has every pick (work-conserving).
	for range 10 {
		require.Equal(t, "flood", q.Pop().job.Tenant)
	}
}

// A tenant over its own caps is passed over, in every lane, and the queue
// answers nil when only such tenants wait.
func TestFairQueueEligibility(t *testing.T) {
	q := newFairQueue(6, 3, 1)
	q.Push(tk(job.PriorityHigh, "capped", "c1"))
	q.Push(tk(job.PriorityLow, "free", "f1"))
	q.Push(tk(job.PriorityHigh, "capped", "c2"))
	notCapped := func(tenant string) bool { return tenant != "capped" }
	require.Equal(t, "f1", q.PopEligible(notCapped).job.ID)
	require.Nil(t, q.PopEligible(notCapped))
	require.Equal(t, 2, q.Len())
	require.Equal(t, "c1", q.PopEligible(nil).job.ID)
}

// frozenHolds is newHolds on a clock that stands still: no admission
// rate is measured, so a group's hold is Config.TenantHold alone.
func frozenHolds(limit int, now time.Time) *holds {
	h := newHolds(limit)
	h.clock = func() time.Time { return now }
	return h
}

func TestHoldsParkAndUnpark(t *testing.T) {
	now := time.Now()
	h := frozenHolds(4, now)
	k := holdKey{tenant: "acme", model: "qwen-plus", lane: job.PriorityNormal}
	for range 4 {
		require.True(t, h.admit(k, false, true))
	}
	assert.True(t, h.admit(k, false, true), "at the hold but nothing waits for admission: no parking")
	h.release(k)
	h.queued(k)
	assert.False(t, h.admit(k, false, true), "at the hold with a job waiting: park")
	assert.True(t, h.admit(k, true, true), "a message from parking is held up to twice the hold")
	assert.True(t, h.admit(holdKey{tenant: "acme", lane: job.PriorityNormal}, false, true), "a message naming no model is never parked")
	assert.True(t, frozenHolds(0, now).admit(k, false, true), "hold 0: parking off")
	h1 := frozenHolds(1, now)
	h1.admit(k, false, true)
	h1.queued(k)
	assert.True(t, h1.admit(k, false, false), "a model that is not saturated: no parking")
	assert.False(t, h1.admit(k, false, true))

	sat := func(string) bool { return true }
	h.markParked(k)
	assert.Empty(t, h.wanted(now, sat), "5 held: no room")
	h.dequeued(k)
	for range 4 {
		h.release(k)
	}
	select {
	case <-h.kick:
	default:
		t.Fatal("room for parked jobs must wake the unparker")
	}
	assert.Equal(t, map[holdKey]int{k: 3}, h.wanted(now, sat), "below half the hold: fill it")
	assert.Empty(t, h.wanted(now, sat), "what is on its way counts")
	for range 3 {
		require.True(t, h.admit(k, true, true))
	}
	for range 3 {
		h.release(k)
	}
	assert.Equal(t, map[holdKey]int{k: 3}, h.wanted(now, sat), "arrived and admitted: room again")
	assert.Equal(t, map[holdKey]int{k: 3}, h.wanted(now.Add(unparkExpiry), sat), "unparked jobs that never came expire")
	assert.Equal(t, map[holdKey]int{k: 4*unsaturatedHolds - 1}, h.wanted(now.Add(2*unparkExpiry), func(string) bool { return false }),
		"a model that is not saturated drains its parked jobs in bigger steps")
	h.drained(k)
	assert.Empty(t, h.wanted(now.Add(2*unparkExpiry), sat), "a drained group is forgotten")
	h.discovered([]store.ParkedGroup{k.group()})
	assert.Equal(t, map[holdKey]int{k: 3}, h.wanted(now.Add(3*unparkExpiry), sat), "until a discovery finds it again")
}

// The direct intake takes a group's jobs up to a hold while its model is
// saturated and up to unsaturatedHolds holds while it is not, never while
// the group has parked jobs (they come first).
func TestHoldsAdmitDirect(t *testing.T) {
	h := frozenHolds(4, time.Now())
	k := holdKey{tenant: "acme", model: "qwen-plus", lane: job.PriorityNormal}
	for range 4 {
		require.True(t, h.admitDirect(k, true, true))
	}
	assert.False(t, h.admitDirect(k, true, true), "saturated: one hold")
	for range 4*unsaturatedHolds - 4 {
		require.True(t, h.admitDirect(k, false, true))
	}
	assert.False(t, h.admitDirect(k, false, true), "not saturated: unsaturatedHolds holds")
	h.release(k)
	assert.True(t, h.admitDirect(k, false, true), "a released hold is room again")
	h.markParked(k)
	for range 4 * unsaturatedHolds {
		h.release(k)
	}
	assert.False(t, h.admitDirect(k, false, true), "a group with parked jobs takes none directly")
	other := holdKey{tenant: "globex", model: "qwen-plus", lane: job.PriorityNormal}
	assert.True(t, h.admitDirect(other, true, true), "groups are counted apart")
}

// Before its model has an admission rate, a fresh replica's direct intake
// takes a group's flood up to max_in_flight while the model is not
// saturated, and a hold while it is; once saturated, excess returns what
// waits beyond a hold; once measured, the fill is the rate's again.
func TestHoldsFirstFillBeforeTheModelIsMeasured(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	h := newHolds(4)
	h.most = 200
	h.clock = func() time.Time { return now }
	k := holdKey{tenant: "acme", model: "qwen-plus", lane: job.PriorityNormal}
	for range 200 {
		require.True(t, h.admitDirect(k, false, true), "unmeasured and not saturated: max_in_flight")
	}
	assert.False(t, h.admitDirect(k, false, true), "no group holds more than max_in_flight")
	for range 200 {
		h.queued(k) // all of them wait in the dispatcher
	}
	assert.Equal(t, map[holdKey]int{k: 196}, h.excess(func(string) bool { return true }),
		"saturated after all: what waits beyond a hold goes back to parking")
	for range 200 {
		h.dequeued(k)
		h.release(k)
	}
	for range 4 {
		require.True(t, h.admitDirect(k, true, true))
	}
	assert.False(t, h.admitDirect(k, true, true), "unmeasured and saturated: a hold")
	for range 4 {
		h.release(k)
	}
	capped := holdKey{tenant: "capped", model: "qwen-plus", lane: job.PriorityNormal}
	for range 4 * unsaturatedHolds {
		require.True(t, h.admitDirect(capped, false, false))
	}
	assert.False(t, h.admitDirect(capped, false, false),
		"a tenant with a cap or budget: unsaturatedHolds holds, as its jobs may never be admitted here")
	for range 4 * unsaturatedHolds {
		h.release(capped)
	}

	// 20 admissions over two windows: measured at 100 a second.
	for range 20 {
		require.True(t, h.admitDirect(k, false, true))
		h.admitted(k)
		now = now.Add(2 * rateWindow / 20)
	}
	require.True(t, h.measured(h.groups[k], k.model))
	n := h.fill(h.groups[k], k.model, false, now)
	require.Less(t, n, 200)
	for range n {
		require.True(t, h.admitDirect(k, false, true))
	}
	assert.False(t, h.admitDirect(k, false, true), "measured: the fill of its rate (%d), not max_in_flight", n)
}

func TestTenantLimitsCaps(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := newTenantLimits(map[string]config.TenantLimits{
		"rpm":    {RPM: 60},   // 1/s, bucket of 10
		"tpm":    {TPM: 6000}, // 100 tokens/s, bucket of 1000
		"budget": {DailyTokens: 500},
		"heavy":  {Weight: 3},
	}, func() float64 { return 0.5 }, nil, nil)
	l.now = func() time.Time { return now }
	require.True(t, l.limited())
	assert.True(t, l.capped("rpm"))
	assert.True(t, l.capped("budget"))
	assert.False(t, l.capped("heavy"), "a weight is no cap")
	assert.False(t, l.capped("unknown"))
	assert.Equal(t, 3.0, l.weight("heavy"))
	assert.Equal(t, 1.0, l.weight("unknown"))
	assert.True(t, l.eligible("unknown"))

	// Half of 60 RPM: a bucket of 5 calls, then one every 2 s.
	for range 5 {
		require.True(t, l.eligible("rpm"))
		l.take("rpm", 10)
	}
	assert.False(t, l.eligible("rpm"))
	now = now.Add(time.Second)
	assert.False(t, l.eligible("rpm"))
	now = now.Add(time.Second)
	assert.True(t, l.eligible("rpm"))

	// Tokens beyond the estimate are debt to pay off before the next call.
	require.True(t, l.eligible("tpm"))
	l.take("tpm", 100)
	l.settle("tpm", 100, 1500) // 500 booked at start, 1500 used: level -1000
	assert.False(t, l.eligible("tpm"))
	now = now.Add(19 * time.Second) // 50 tokens/s × 19 s = 950: still in debt
	assert.False(t, l.eligible("tpm"))
	now = now.Add(2 * time.Second)
	assert.True(t, l.eligible("tpm"))

	// The daily budget counts every token settled.
	l.settle("budget", 0, 499)
	assert.True(t, l.eligible("budget"))
	l.settle("budget", 0, 1)
	assert.False(t, l.eligible("budget"))
}

// A group of a model that is not saturated is refilled from parking once
// it falls below half its fill (wanted); releasing its jobs must wake the
// unparker there, not only below half a hold, or it drains empty between
// the unparker's ticks.
func TestReleaseWakesUnparkerAtHalfTheFill(t *testing.T) {
	now := time.Now()
	h := frozenHolds(4, now)
	k := holdKey{tenant: "a", model: "m", lane: job.PriorityNormal}
	fill := h.fill(nil, k.model, false, now)
	for range fill {
		require.True(t, h.admitDirect(k, false, true) || h.admit(k, false, false))
	}
	h.markParked(k)
	for range fill - fill/2 {
		h.release(k)
	}
	select {
	case <-h.kick:
		t.Fatal("at half the fill: no room yet")
	default:
	}
	h.release(k)
	select {
	case <-h.kick:
	default:
		t.Fatal("below half the fill: the unparker must wake")
	}
	assert.Equal(t, map[holdKey]int{k: fill - (fill/2 - 1)}, h.wanted(now, func(string) bool { return false }))
}

// A group admitted hundreds of jobs a second holds a second of them, not
// a hold of four: a flood of one tenant on a model that admits that fast
// is taken directly instead of parked job by job. When its admissions
// stop, the hold shrinks back as the rate's window runs out.
func TestHoldsSpanWhatTheGroupIsAdmitted(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	h := newHolds(4)
	h.clock = func() time.Time { return now }
	k := holdKey{tenant: "acme", model: "qwen-plus", lane: job.PriorityNormal}
	admitted := func(n int, over time.Duration) { // n admissions spread over the span
		for range n {
			require.True(t, h.admit(k, false, false))
			h.admitted(k)
			now = now.Add(over / time.Duration(n))
		}
	}
	require.True(t, h.admit(k, false, false)) // one held throughout keeps the group known
	h.queued(k)
	admitted(60, 200*time.Millisecond) // 300 a second
	for range 299 {
		require.True(t, h.admitDirect(k, true, true), "saturated, at 300 admissions a second: room for 300")
	}
	assert.False(t, h.admitDirect(k, true, true), "the bound is a second of admissions")
	assert.False(t, h.admit(k, false, true), "the same bound for a lane delivery")
	for range 100 {
		h.release(k)
	}
	for range 100 {
		require.True(t, h.admit(k, false, true))
	}
	assert.False(t, h.admit(k, false, true))
	assert.Empty(t, h.excess(func(string) bool { return true }), "one job waits: nothing to return")

	now = now.Add(3 * time.Second) // no admission since
	assert.Less(t, h.spanHold(h.groups[k], k.model, now), 60, "three seconds without an admission: the hold shrinks")
	now = now.Add(time.Minute)
	assert.Equal(t, 4, max(h.limit, h.spanHold(h.groups[k], k.model, now)), "a minute without one: the hold alone")

	// A group not measured yet starts from its model's last busy window,
	// which an idle minute does not spoil.
	other := holdKey{tenant: "globex", model: "qwen-plus", lane: job.PriorityNormal}
	require.True(t, h.admit(other, false, true))
	h.admitted(other) // closes the model's idle window
	assert.InDelta(t, 300, h.spanHold(nil, other.model, now), 20, "the model's rate before the idle minute")
	for range 250 {
		require.True(t, h.admitDirect(other, true, true), "a new group on a model that admits 300 a second")
	}
	assert.Zero(t, h.spanHold(nil, "another-model", now), "a model never admitted: the hold alone")
	h.most = 100
	assert.Equal(t, 100, h.spanHold(nil, other.model, now), "never more than the worker's max_in_flight")

	// Jobs settled before admission (returned to parking, duplicates) are
	// no admissions: counted, the hold grew with the churn it caused.
	h2 := newHolds(4)
	h2.clock = func() time.Time { return now }
	churn := holdKey{tenant: "churn", model: "m2", lane: job.PriorityNormal}
	require.True(t, h2.admit(churn, false, false))
	for range 60 {
		require.True(t, h2.admit(churn, false, false))
		h2.release(churn)
		now = now.Add(200 * time.Millisecond / 60)
	}
	assert.Zero(t, h2.spanHold(h2.groups[churn], churn.model, now), "releases are not admissions")
}
