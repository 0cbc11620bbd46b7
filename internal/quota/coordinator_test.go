package quota

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

const model = "qwen-plus"

// cfgModel: RPM 1200 (20/s), TPM 600k (10k/s), 30 slots.
var cfgModel = config.Model{RPM: 1200, TPM: 600000, MaxConcurrency: 30}

// ledger holds the limits every replica's governor has applied and checks,
// at every SetLimits, that they sum within the model's quota.
type ledger struct {
	mu         sync.Mutex
	m          config.Model
	cur        map[string]ratecontrol.Limits
	dead       map[string]bool
	violations []string
}

func newLedger(m config.Model) *ledger {
	return &ledger{m: m, cur: map[string]ratecontrol.Limits{}, dead: map[string]bool{}}
}

func (l *ledger) set(id string, lim ratecontrol.Limits) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead[id] {
		return
	}
	l.cur[id] = lim
	var rpm, tpm float64
	conc := 0
	for _, c := range l.cur {
		rpm += c.RPM
		tpm += c.TPM
		// A replica whose share is below one slot still gets one (Limits),
		// so the slot sum may exceed max_concurrency by those; a paused
		// governor holds that slot but admits nothing.
		if float64(l.m.MaxConcurrency)*c.RPM/l.m.RPM >= 1 {
			conc += c.MaxConcurrency
		}
	}
	const tol = 1e-3
	if rpm > l.m.RPM+tol || tpm > l.m.TPM+tol || conc > l.m.MaxConcurrency {
		l.violations = append(l.violations, fmt.Sprintf("after %s set %+v: rpm %.4f tpm %.4f concurrency %d", id, lim, rpm, tpm, conc))
	}
}

// kill models a replica process dying: its governor sends nothing more.
func (l *ledger) kill(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dead[id] = true
	delete(l.cur, id)
}

func (l *ledger) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Empty(t, l.violations, "governor limits summed above the quota")
}

type fakeGov struct {
	id string
	l  *ledger

	mu        sync.Mutex
	limits    ratecontrol.Limits
	penalties []ratecontrol.Classification
	holds     int // pauses
	resumes   int
	snap      ratecontrol.Snapshot
}

func (g *fakeGov) SetLimits(lim ratecontrol.Limits) {
	g.mu.Lock()
	g.limits = lim
	g.mu.Unlock()
	if g.l != nil {
		g.l.set(g.id, lim)
	}
}

func (g *fakeGov) Penalize(c ratecontrol.Classification) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.penalties = append(g.penalties, c)
}

func (g *fakeGov) Pause(time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holds++
}

func (g *fakeGov) Resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.resumes++
}

func (g *fakeGov) Snapshot() ratecontrol.Snapshot {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.snap
}

func (g *fakeGov) Limits() ratecontrol.Limits {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limits
}

func (g *fakeGov) Penalties() []ratecontrol.Classification {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]ratecontrol.Classification(nil), g.penalties...)
}

type replica struct {
	*Coordinator
	gov *fakeGov
}

// full is the demand of a replica under a full backlog.
func full(string) Demand { return Demand{Requests: 1e9, Tokens: 1e9} }

func newReplica(t *testing.T, pool *pgxpool.Pool, id string, l *ledger, q config.Quota, opts ...Option) replica {
	t.Helper()
	g := &fakeGov{id: id, l: l}
	opts = append([]Option{WithDemand(full)}, opts...)
	c := New(pool, id, map[string]config.Model{model: cfgModel}, func(string) Governor { return g }, q, opts...)
	return replica{c, g}
}

func (r replica) share() Share { return r.Shares()[model] }

func mustTick(t *testing.T, rs ...replica) {
	t.Helper()
	for _, r := range rs {
		rep := r.tick(context.Background())
		require.NoError(t, rep.Err, "round of %s", r.id)
	}
}

// dbSum reads the published shares of the model's live members.
func dbSum(t *testing.T, pool *pgxpool.Pool) (sum Share, members int) {
	t.Helper()
	err := pool.QueryRow(context.Background(),
		`SELECT coalesce(sum(share_requests), 0), coalesce(sum(share_tokens), 0), count(*) FROM quota_members WHERE model = $1`,
		model).Scan(&sum.Requests, &sum.Tokens, &members)
	require.NoError(t, err)
	return sum, members
}

func requireWithin(t *testing.T, pool *pgxpool.Pool, l *ledger) {
	t.Helper()
	sum, _ := dbSum(t, pool)
	require.LessOrEqual(t, sum.Requests, 1.0)
	require.LessOrEqual(t, sum.Tokens, 1.0)
	l.check(t)
}

var q = config.Quota{Shared: true, LeaseTTL: 3 * time.Second, FallbackShare: 0.25}

func TestJoinAndLeaveKeepSharesWithinLimit(t *testing.T) {
	t.Parallel()
	pool := testsvc.Postgres(t)
	l := newLedger(cfgModel)
	reg := prometheus.NewRegistry()
	a := newReplica(t, pool, "a", l, q, WithRegisterer(reg))
	b := newReplica(t, pool, "b", l, q)
	c := newReplica(t, pool, "c", l, q)
	require.Less(t, a.gov.Limits().RPM, 1e-3, "New pauses the governor")
	require.Equal(t, 1, a.gov.holds, "and holds it")
	require.Zero(t, a.gov.resumes)

	steps := []struct {
		who  replica
		want float64
	}{
		{a, 1}, // alone
		{b, 0}, // joins: no room yet
		{a, 0.5},
		{b, 0.5},
		{c, 0},
		{a, 1. / 3},
		{b, 1. / 3},
		{c, 1. / 3},
		{a, 1. / 3}, // stable
	}
	for i, s := range steps {
		mustTick(t, s.who)
		requireWithin(t, pool, l)
		require.InDelta(t, s.want, s.who.share().Requests, 1e-6, "step %d (%s)", i, s.who.id)
	}
	require.GreaterOrEqual(t, b.gov.holds, 2, "a paused governor's hold is renewed every round")
	require.Positive(t, a.gov.resumes, "the round that gives a share resumes the governor")
	select {
	case <-c.Ready():
	default:
		t.Fatal("c has a share but is not ready")
	}
	sum, n := dbSum(t, pool)
	require.Equal(t, 3, n)
	require.InDelta(t, 1, sum.Requests, 1e-6, "together they use the whole quota")
	require.Equal(t, 10, a.gov.Limits().MaxConcurrency)
	require.InDelta(t, 400, a.gov.Limits().RPM, 1e-3)

	// b leaves with Close: the others absorb in their next round.
	require.NoError(t, b.Close(context.Background()))
	require.Less(t, b.gov.Limits().RPM, 1e-3, "Close pauses the governor")
	_, n = dbSum(t, pool)
	require.Equal(t, 2, n, "Close hands the lease back at once")
	mustTick(t, a)
	requireWithin(t, pool, l)
	require.InDelta(t, 0.5, a.share().Requests, 1e-6)
	mustTick(t, c)
	requireWithin(t, pool, l)
	require.InDelta(t, 0.5, c.share().Requests, 1e-6)
	sum, _ = dbSum(t, pool)
	require.InDelta(t, 1, sum.Tokens, 1e-6)

	mf, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range mf {
		names[f.GetName()] = true
	}
	for _, want := range []string{"llmq_quota_share", "llmq_quota_members", "llmq_quota_renewals_total", "llmq_quota_round_seconds"} {
		require.True(t, names[want], "metric %s", want)
	}
	require.NoError(t, a.Close(context.Background()))
	require.NoError(t, c.Close(context.Background()))
}

func TestDemandWeightedSplit(t *testing.T) {
	t.Parallel()
	pool := testsvc.Postgres(t)
	l := newLedger(cfgModel)
	demand := func(d Demand) Option { return WithDemand(func(string) Demand { return d }) }
	// Limit 20 req/s and 10k tokens/s.
	a := newReplica(t, pool, "a", l, q, demand(Demand{Requests: 4, Tokens: 2000}))
	b := newReplica(t, pool, "b", l, q, demand(Demand{Requests: 12, Tokens: 6000}))
	idle := newReplica(t, pool, "idle", l, q, demand(Demand{}))
	for range 4 {
		mustTick(t, a, b)
		requireWithin(t, pool, l)
	}
	require.InDelta(t, 0.25, a.share().Requests, 1e-6)
	require.InDelta(t, 0.75, b.share().Tokens, 1e-6)

	// An idle replica keeps the floor (5% of the limit / 3) and no more.
	for range 3 {
		mustTick(t, idle, a, b)
		requireWithin(t, pool, l)
	}
	floor := 0.05 * 20 / 3
	sumW := 4 + 12 + floor
	require.InDelta(t, floor/sumW, idle.share().Requests, 1e-6)
	require.InDelta(t, 4/sumW, a.share().Requests, 1e-6)
	require.InDelta(t, 12/sumW, b.share().Requests, 1e-6)
	for _, r := range []replica{a, b, idle} {
		require.NoError(t, r.Close(context.Background()))
	}
}

// TestRunAbsorbsKilledMember runs three coordinators concurrently, kills
// one (its Run ends without Close, as SIGKILL would) and checks that the
// survivors absorb its share in their first round after its lease expired.
func TestRunAbsorbsKilledMember(t *testing.T) {
	t.Parallel()
	url := testsvc.PostgresURL(t)
	l := newLedger(cfgModel)
	const interval = 200 * time.Millisecond
	qq := q
	qq.LeaseTTL = 2 * time.Second

	type obs struct {
		mu      sync.Mutex
		reports []Report
		changed chan struct{}
	}
	o := &obs{changed: make(chan struct{}, 1)}
	observe := WithObserver(func(r Report) {
		if r.Err != nil {
			t.Logf("%s: round failed: %v", r.Replica, r.Err)
		}
		o.mu.Lock()
		o.reports = append(o.reports, r)
		o.mu.Unlock()
		select {
		case o.changed <- struct{}{}:
		default:
		}
	})
	// waitFor waits, on round reports and with a deadline, until cond holds.
	waitFor := func(what string, deadline time.Duration, cond func() bool) {
		t.Helper()
		timer := time.NewTimer(deadline)
		defer timer.Stop()
		for !cond() {
			select {
			case <-o.changed:
			case <-timer.C:
				t.Fatalf("timed out after %v waiting for %s", deadline, what)
			}
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	rs := map[string]replica{}
	cancels := map[string]context.CancelFunc{}
	runErr := make(chan error, 3)
	for _, id := range []string{"a", "b", "c"} {
		pool := pgPool(t, url, nil)
		r := newReplica(t, pool, id, l, qq, WithInterval(interval), observe)
		rs[id] = r
		rctx, rcancel := context.WithCancel(ctx)
		cancels[id] = rcancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			runErr <- r.Run(rctx)
		}()
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	near := func(r replica, want float64) bool { return abs(r.share().Requests-want) < 1e-6 }
	waitFor("three equal shares", 10*time.Second, func() bool {
		return near(rs["a"], 1./3) && near(rs["b"], 1./3) && near(rs["c"], 1./3)
	})
	l.check(t)

	killed := time.Now()
	cancels["c"]()
	require.NoError(t, <-runErr)
	l.kill("c")
	_, n := dbSum(t, rs["a"].pool)
	require.Equal(t, 3, n, "a killed replica's lease lives until it expires")

	// rounds returns, for one survivor, the index among its successful
	// rounds of the first one after the kill that saw two members (gone)
	// and of the first from then on that applied half the quota (full), -1
	// for either not seen yet. It reads the reports rather than Shares: a
	// round applies its shares before its report reaches the observer.
	rounds := func(id string) (gone, full int) {
		o.mu.Lock()
		defer o.mu.Unlock()
		gone, full = -1, -1
		i := 0
		for _, r := range o.reports {
			if r.Replica != id || r.Err != nil {
				continue
			}
			mr := r.Models[model]
			if gone < 0 && len(mr.Members) == 2 && r.At.After(killed) {
				gone = i
			}
			if full < 0 && gone >= 0 && abs(mr.Applied.Requests-0.5) < 1e-6 {
				full = i
			}
			i++
		}
		return gone, full
	}
	waitFor("the survivors to absorb c's share", 10*qq.LeaseTTL, func() bool {
		_, fa := rounds("a")
		_, fb := rounds("b")
		return fa >= 0 && fb >= 0
	})
	absorbed := time.Since(killed)
	l.check(t)
	// In rounds: each survivor reaches its new share in the same round in
	// which c's expired lease disappears from its view, or the next.
	for _, id := range []string{"a", "b"} {
		gone, full := rounds(id)
		require.LessOrEqual(t, full-gone, 2, "%s absorbs within 2 rounds of the expiry", id)
	}
	require.True(t, near(rs["a"], 0.5) && near(rs["b"], 0.5), "the shares the survivors hold: a %v, b %v",
		rs["a"].share().Requests, rs["b"].share().Requests)
	t.Logf("killed member absorbed after %v (lease_ttl %v, interval %v)", absorbed.Round(time.Millisecond), qq.LeaseTTL, interval)

	// Close of a survivor: handed back, b takes all in its next round.
	require.NoError(t, rs["a"].Close(context.Background()))
	require.NoError(t, <-runErr)
	waitFor("b to take the whole quota", 5*time.Second, func() bool { return near(rs["b"], 1) })
	l.check(t)
	require.ErrorIs(t, rs["a"].Run(ctx), ErrClosed)
}

// TestConcurrentRoundsWithShiftingDemand: three replicas round every 10 ms
// with demands that change every round; the governors' limits and the
// published shares never sum above the quota.
func TestConcurrentRoundsWithShiftingDemand(t *testing.T) {
	t.Parallel()
	url := testsvc.PostgresURL(t)
	l := newLedger(cfgModel)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var rounds atomic.Int64
	done := make(chan struct{})
	var doneOnce sync.Once
	for i, id := range []string{"a", "b", "c"} {
		var n atomic.Uint64
		n.Store(uint64(i) * 7)
		demand := WithDemand(func(string) Demand {
			x := float64(n.Add(5) % 23) // a deterministic walk per replica
			return Demand{Requests: x, Tokens: 23 * 500 / (1 + x)}
		})
		r := newReplica(t, pgPool(t, url, nil), id, l, q, WithInterval(10*time.Millisecond), demand,
			WithObserver(func(Report) {
				if rounds.Add(1) >= 300 {
					doneOnce.Do(func() { close(done) })
				}
			}))
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = r.Run(ctx)
		}()
	}
	checker := pgPool(t, url, nil)
	timeout := time.After(time.Minute)
	checks := 0
loop:
	for {
		select {
		case <-done:
			break loop
		case <-timeout:
			t.Fatal("timed out waiting for 300 rounds")
		default:
		}
		sum, _ := dbSum(t, checker)
		require.LessOrEqual(t, sum.Requests, 1.0)
		require.LessOrEqual(t, sum.Tokens, 1.0)
		checks++
	}
	cancel()
	wg.Wait()
	l.check(t)
	t.Logf("%d rounds, %d concurrent reads of the shares: never above the quota", rounds.Load(), checks)
}

// pgPool opens a pool on url, whose dials fail while down is set.
func pgPool(t *testing.T, url string, down *atomic.Bool) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	if down != nil {
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if down.Load() {
				return nil, errors.New("test: Postgres is unreachable")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestFallbackWhenPostgresIsUnreachable(t *testing.T) {
	t.Parallel()
	url := testsvc.PostgresURL(t)
	for _, tc := range []struct {
		name  string
		share float64
	}{{"fallback share", 0.25}, {"fail closed", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			var down atomic.Bool
			now := time.Now()
			var clockMu sync.Mutex
			clock := func() time.Time {
				clockMu.Lock()
				defer clockMu.Unlock()
				return now
			}
			qq := q
			qq.FallbackShare = tc.share
			id := "a-" + tc.name
			a := newReplica(t, pgPool(t, url, &down), id, nil, qq, WithClock(clock))
			b := newReplica(t, pgPool(t, url, nil), "b-"+tc.name, nil, qq)
			mustTick(t, a, b, a, b)
			require.InDelta(t, 0.5, a.share().Requests, 1e-6)

			down.Store(true)
			a.pool.Reset() // drop the open connections: the next round must dial
			_, err := a.round(context.Background(), clock())
			require.Error(t, err)
			a.tick(context.Background())
			require.True(t, a.Fallback())
			want := min(0.5, tc.share)
			require.InDelta(t, want, a.share().Requests, 1e-9, "lease live: min(applied, fallback)")

			clockMu.Lock()
			now = now.Add(qq.LeaseTTL)
			clockMu.Unlock()
			a.tick(context.Background())
			require.InDelta(t, tc.share, a.share().Requests, 1e-9, "lease expired: fallback share")
			if tc.share == 0 {
				require.Less(t, a.gov.Limits().RPM, 1e-3, "fail closed: nothing is sent")
			} else {
				require.InDelta(t, tc.share*cfgModel.RPM, a.gov.Limits().RPM, 1e-6)
			}

			down.Store(false)
			a.tick(context.Background())
			require.False(t, a.Fallback(), "recovers with the first round that commits")
			mustTick(t, b, a, b, a)
			require.InDelta(t, 0.5, a.share().Requests, 1e-6)
			require.InDelta(t, 0.5, b.share().Requests, 1e-6)
			require.NoError(t, a.Close(context.Background()))
			require.NoError(t, b.Close(context.Background()))
		})
	}

	t.Run("starting without Postgres", func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		now := time.Now()
		a := newReplica(t, pgPool(t, url, &down), "newcomer", nil, q, WithClock(func() time.Time { return now }))
		a.tick(context.Background())
		require.True(t, a.Fallback())
		require.Zero(t, a.share().Requests, "a slow Postgres is no reason to over-commit")
		now = now.Add(q.LeaseTTL)
		a.tick(context.Background())
		require.InDelta(t, 0.25, a.share().Requests, 1e-9, "unreachable for a lease_ttl: the fallback share")
		select {
		case <-a.Ready():
		default:
			t.Fatal("a replica on a positive fallback share is ready")
		}
	})
}

func TestPenaltiesReachTheOtherReplicas(t *testing.T) {
	t.Parallel()
	pool := testsvc.Postgres(t)
	a := newReplica(t, pool, "a", nil, q)
	b := newReplica(t, pool, "b", nil, q)
	c := newReplica(t, pool, "c", nil, q)
	mustTick(t, a, b, c)

	a.Report429(model, ratecontrol.Classification{Kind: ratecontrol.KindOK}) // not a 429: ignored
	a.Report429("other-model", ratecontrol.Classification{Kind: ratecontrol.KindRateLimitTokens})
	a.Report429(model, ratecontrol.Classification{Kind: ratecontrol.KindRateLimitTokens, Code: "insufficient_quota",
		Message: "secret-ish provider text", RetryAfter: 2 * time.Second})
	a.Report429(model, ratecontrol.Classification{Kind: ratecontrol.KindRateLimitTokens, RetryAfter: time.Second})
	a.flushPenalties(context.Background())
	var stored int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM quota_penalties`).Scan(&stored))
	require.Equal(t, 2, stored)

	mustTick(t, b, c, a)
	for _, r := range []replica{b, c} {
		p := r.gov.Penalties()
		require.Len(t, p, 1, "%s: one Penalize per model and round", r.id)
		require.Equal(t, ratecontrol.KindRateLimitTokens, p[0].Kind)
		require.Equal(t, "insufficient_quota", p[0].Code)
		require.Equal(t, 2*time.Second, p[0].RetryAfter)
		require.Empty(t, p[0].Message, "provider text is not shared")
	}
	require.Empty(t, a.gov.Penalties(), "a replica is not penalized for its own 429")
	mustTick(t, b)
	require.Len(t, b.gov.Penalties(), 1, "a penalty is applied once")

	// A replica joining later does not replay history.
	d := newReplica(t, pool, "d", nil, q)
	mustTick(t, d, d)
	require.Empty(t, d.gov.Penalties())
	for _, r := range []replica{a, b, c, d} {
		require.NoError(t, r.Close(context.Background()))
	}
}

// TestAPenaltyCommittedAfterAHigherOneIsApplied: a bigserial is taken
// before the commit, so a replica's 429 can become visible after another
// one with a higher seq that a round already read. Read by seq alone, it
// was skipped for good.
func TestAPenaltyCommittedAfterAHigherOneIsApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testsvc.Postgres(t)
	b := newReplica(t, pool, "b", nil, q)
	mustTick(t, b)
	insert := func(seq int64) {
		_, err := pool.Exec(ctx, `INSERT INTO quota_penalties (seq, model, replica_id, kind) VALUES ($1, $2, 'a', $3)`,
			seq, model, ratecontrol.KindRateLimitTokens.String())
		require.NoError(t, err)
	}
	insert(1000) // committed first
	mustTick(t, b)
	require.Len(t, b.gov.Penalties(), 1)
	insert(500) // its seq taken earlier, committed now
	mustTick(t, b)
	require.Len(t, b.gov.Penalties(), 2, "the late penalty is applied")
	mustTick(t, b, b)
	require.Len(t, b.gov.Penalties(), 2, "each penalty once, though the window reads it again")
	require.NoError(t, b.Close(ctx))
}

// TestAPenaltyIsAppliedOnceWhateverItsClock: a penalty stamped an hour
// ahead (Postgres's clock stepped back since, or a standby's behind) and
// one stamped now are each applied once; forgetting the second because it
// looked old beside the first made the window read it as new every round.
func TestAPenaltyIsAppliedOnceWhateverItsClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testsvc.Postgres(t)
	b := newReplica(t, pool, "b", nil, q)
	mustTick(t, b)
	insert := func(at string) {
		_, err := pool.Exec(ctx, `INSERT INTO quota_penalties (model, replica_id, kind, at) VALUES ($1, 'a', $2, `+at+`)`,
			model, ratecontrol.KindRateLimitTokens.String())
		require.NoError(t, err)
	}
	insert("now() + interval '1 hour'")
	mustTick(t, b)
	insert("now()")
	mustTick(t, b)
	require.Len(t, b.gov.Penalties(), 2)
	mustTick(t, b, b, b)
	require.Len(t, b.gov.Penalties(), 2, "neither is applied again")
	insert("now() - interval '1 hour'") // a new seq, its insert long begun
	mustTick(t, b, b)
	require.Len(t, b.gov.Penalties(), 3, "a new seq is applied once, however old")
	require.NoError(t, b.Close(ctx))
}

// TestPausedGovernorResumes: a real auto governor whose caller is already
// waiting in Acquire while paused (share 0, New) is admitted once the
// share arrives, instead of sleeping on a wait booked under the tiny quota.
func TestPausedGovernorResumes(t *testing.T) {
	t.Parallel()
	pool := testsvc.Postgres(t)
	m := config.Model{RPM: 1200, TPM: 600000, MaxConcurrency: 10, Warmup: -1}
	gov := ratecontrol.NewGovernor(ratecontrol.StrategyAuto, Limits(m, Share{1, 1}))
	c := New(pool, "a", map[string]config.Model{model: m}, func(string) Governor { return gov }, q,
		WithInterval(100*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admitted := make(chan error, 1)
	go func() {
		p, err := gov.Acquire(ctx, ratecontrol.Request{InputTokens: 100, MaxTokens: 100})
		if err == nil {
			p.Cancel()
		}
		admitted <- err
	}()
	rep := c.tick(ctx) // alone: the whole quota
	require.NoError(t, rep.Err)
	require.InDelta(t, 1, c.Shares()[model].Requests, 1e-6)
	select {
	case err := <-admitted:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the caller that waited while paused was not admitted after the share arrived")
	}
	require.NoError(t, c.Close(context.Background()))
}

func TestDemandFromSnapshot(t *testing.T) {
	g := &fakeGov{}
	start := time.Now()
	c := New(nil, "a", map[string]config.Model{model: cfgModel}, func(string) Governor { return g }, q)
	// No history, nothing admitted yet: unknown (the round uses the others').
	_, known := c.measure(model, Share{}, start)
	require.False(t, known)
	_, known = c.measure(model, Share{}, start.Add(time.Second))
	require.False(t, known, "nothing admitted yet")
	// Admitted something in the interval: busy, wants the whole limit
	// (20 req/s, 10k tok/s), however slowly it went.
	g.snap.Granted = 2
	d, known := c.measure(model, Share{0.5, 0.5}, start.Add(3*time.Second))
	require.True(t, known)
	require.Equal(t, Demand{20, 10000}, d)
	// Nothing admitted, but admission in debt: busy too.
	g.snap.Levels = map[string]float64{ratecontrol.DimTokens: -30}
	d, _ = c.measure(model, Share{0.5, 0.5}, start.Add(4*time.Second))
	require.Equal(t, Demand{20, 10000}, d)
	// Nothing admitted for a while: still busy (it may sleep on a wait
	// booked under a smaller share) …
	g.snap.Levels = nil
	d, _ = c.measure(model, Share{0.5, 0.5}, start.Add(10*time.Second))
	require.Equal(t, Demand{20, 10000}, d)
	// … until idle for busyHold: the floor.
	d, known = c.measure(model, Share{0.5, 0.5}, start.Add(4*time.Second+busyHold))
	require.True(t, known)
	require.Equal(t, Demand{}, d)
}

func TestDemandFromBacklog(t *testing.T) {
	g := &fakeGov{}
	backlog := 0
	start := time.Now()
	c := New(nil, "a", map[string]config.Model{model: cfgModel}, func(string) Governor { return g }, q,
		WithBacklog(func(string) int { return backlog }))
	_, known := c.measure(model, Share{}, start)
	require.False(t, known)
	backlog = 3
	d, known := c.measure(model, Share{}, start.Add(time.Second))
	require.True(t, known)
	require.Equal(t, Demand{20, 10000}, d, "jobs waiting: wants the whole limit")
	// No backlog: wants the rate it admitted (4 in 2 s = 2 req/s of 20).
	backlog = 0
	g.snap.Granted = 4
	c.samples[model] = sample{at: start, granted: 0}
	d, known = c.measure(model, Share{0.5, 0.5}, start.Add(2*time.Second))
	require.True(t, known)
	require.InDelta(t, 2, d.Requests, 1e-9)
	require.InDelta(t, 1000, d.Tokens, 1e-9)
}

func TestTypicalDemand(t *testing.T) {
	require.Equal(t, Demand{20, 10000}, typicalDemand(nil, cfgModel), "alone: the whole limit")
	require.Equal(t, Demand{5, 300}, typicalDemand([]Member{{Demand: Demand{4, 200}}, {Demand: Demand{6, 400}}}, cfgModel))
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// A governor New paused is sending again after the round that gives it a
// share, with its concurrency uncut: the pause is no 429 and does not
// outlast that round (it used to hold a fresh consumer for 3.5 s).
func TestFirstRoundResumesTheGovernor(t *testing.T) {
	t.Parallel()
	pool := testsvc.Postgres(t)
	g := ratecontrol.NewGovernor(ratecontrol.StrategyAuto, ratecontrol.Limits{})
	c := New(pool, "fresh", map[string]config.Model{model: cfgModel}, func(string) Governor { return g }, q)
	s := g.Snapshot().Controller
	require.Equal(t, ratecontrol.StateDrain, s.State, "New pauses the governor")
	limit := s.Limit
	rep := c.tick(context.Background())
	require.NoError(t, rep.Err)
	require.Positive(t, c.Shares()[model].Requests)
	s = g.Snapshot().Controller
	require.NotEqual(t, ratecontrol.StateDrain, s.State, "the first round's share resumes it")
	require.Zero(t, s.Cuts, "a pause cuts nothing")
	require.Equal(t, limit, s.Limit)
}
