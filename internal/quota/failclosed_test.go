package quota

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/testsvc"
)

// With fail_closed (fallback_share 0) a replica whose rounds fail for a
// lease_ttl runs at share 0. A caller that comes meanwhile waits, and
// goes once the share is back, whatever the strategy. Under ratelimit and
// shaping, which have no controller to pause, it used to book under a
// quota of almost nothing and sleep on after the share came back.
func TestFailClosedCallersGoOnceTheShareIsBack(t *testing.T) {
	for _, strategy := range []ratecontrol.Strategy{ratecontrol.StrategyAuto, ratecontrol.StrategyRateLimit, ratecontrol.StrategyShaping} {
		t.Run(string(strategy), func(t *testing.T) {
			pool := testsvc.Postgres(t)
			m := config.Model{RPM: 1200, TPM: 600000, MaxConcurrency: 10, Warmup: -1}
			gov := ratecontrol.NewGovernor(strategy, Limits(m, Share{1, 1}))
			qq := config.Quota{Shared: true, LeaseTTL: 3 * time.Second, FallbackShare: 0, FailClosed: true}
			c := New(pool, "a-"+string(strategy), map[string]config.Model{model: m}, func(string) Governor { return gov }, qq)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			require.NoError(t, c.tick(ctx).Err)
			require.InDelta(t, 1, c.Shares()[model].Requests, 1e-6)

			c.setLimits(model, Share{}) // what fallBack applies once the lease has lapsed, fail closed
			admitted := make(chan error, 1)
			go func() {
				p, err := gov.Acquire(ctx, ratecontrol.Request{InputTokens: 100, MaxTokens: 100})
				if err == nil {
					p.Cancel()
				}
				admitted <- err
			}()
			time.Sleep(200 * time.Millisecond)  // the caller comes during the outage
			require.NoError(t, c.tick(ctx).Err) // Postgres answers again
			require.InDelta(t, 1, c.Shares()[model].Requests, 1e-6)
			select {
			case err := <-admitted:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Errorf("%s: a caller that came while the share was 0 still waits 10 s after the share came back", strategy)
			}
			cancel()
			require.NoError(t, c.Close(context.Background()))
		})
	}
}

// A shaping caller that took its concurrency slot while the share was 0
// booked its pacer under a send interval of years. The share given back
// brings that schedule in: the next caller goes at once, not years later.
func TestAPacerBookedAtShareZeroIsPulledInOnResume(t *testing.T) {
	pool := testsvc.Postgres(t)
	m := config.Model{RPM: 1200, TPM: 600000, MaxConcurrency: 1, Warmup: -1}
	gov := ratecontrol.NewGovernor(ratecontrol.StrategyShaping, Limits(m, Share{1, 1}))
	qq := config.Quota{Shared: true, LeaseTTL: 3 * time.Second, FallbackShare: 0, FailClosed: true}
	c := New(pool, "pacer", map[string]config.Model{model: m}, func(string) Governor { return gov }, qq)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, c.tick(ctx).Err)

	req := ratecontrol.Request{InputTokens: 100, MaxTokens: 100}
	a, err := gov.Acquire(ctx, req)
	require.NoError(t, err)
	took := make(chan *ratecontrol.Permit, 1)
	go func() {
		p, err := gov.Acquire(ctx, req) // waits for a's slot
		if err == nil {
			took <- p
		}
	}()
	time.Sleep(200 * time.Millisecond)
	c.setLimits(model, Share{}) // fail closed
	a.Cancel()                  // b takes the slot now, under share 0
	var b *ratecontrol.Permit
	select {
	case b = <-took:
	case <-time.After(10 * time.Second):
		t.Fatal("b did not take the slot")
	}
	c.setLimits(model, Share{Requests: 1, Tokens: 1}) // Postgres answers again
	b.Cancel()

	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	p, err := gov.Acquire(cctx, req)
	require.NoError(t, err, "the next caller goes")
	p.Cancel()
	require.NoError(t, c.Close(context.Background()))
}
