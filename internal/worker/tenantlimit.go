package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/config"
)

// tenantLimits applies each tenant's own caps on top of the fair share:
// tenants.<name>.rpm and .tpm over every model (token buckets holding ten
// seconds of the cap, refilled continuously; a call's tokens beyond its
// estimate become debt, settled from what the provider reported), and
// .daily_tokens per UTC day. The caps belong to the tenant, not to a
// replica: each replica applies its share of them (Deps.TenantShare, the
// replica's fraction of the shared quota), and the daily budget is read
// from the usage every replica records (Deps.TenantUsage).
type tenantLimits struct {
	cfg   map[string]config.TenantLimits
	share func() float64
	usage func(ctx context.Context) (map[string]int64, error)
	now   func() time.Time
	log   *slog.Logger

	mu      sync.Mutex
	buckets map[string]*tenantBuckets
	// used is each budgeted tenant's tokens today: the last read of the
	// shared usage plus what this replica settled since.
	used map[string]int64
}

type tenantBuckets struct {
	calls, tokens bucket
}

// bucket is a token bucket that may go into debt.
type bucket struct {
	level float64
	at    time.Time
}

// usageEvery is how often the daily budgets re-read the shared usage.
const usageEvery = 5 * time.Second

func newTenantLimits(cfg map[string]config.TenantLimits, share func() float64, usage func(context.Context) (map[string]int64, error), log *slog.Logger) *tenantLimits {
	if share == nil {
		share = func() float64 { return 1 }
	}
	return &tenantLimits{cfg: cfg, share: share, usage: usage, now: time.Now, log: log,
		buckets: map[string]*tenantBuckets{}, used: map[string]int64{}}
}

// weight is the tenant's weight in the fair share.
func (l *tenantLimits) weight(tenant string) float64 {
	if c, ok := l.cfg[tenant]; ok && c.Weight > 0 {
		return c.Weight
	}
	return 1
}

// limited reports whether any tenant has a cap or a budget, so dispatchers
// of a configuration without any skip the checks.
func (l *tenantLimits) limited() bool {
	for tenant := range l.cfg {
		if l.capped(tenant) {
			return true
		}
	}
	return false
}

// capped reports whether tenant has a cap or a budget.
func (l *tenantLimits) capped(tenant string) bool {
	c, ok := l.cfg[tenant]
	return ok && (c.RPM > 0 || c.TPM > 0 || c.DailyTokens > 0)
}

// eligible reports whether the tenant may have a call admitted now.
func (l *tenantLimits) eligible(tenant string) bool {
	if !l.capped(tenant) {
		return true
	}
	c := l.cfg[tenant]
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.DailyTokens > 0 && l.used[tenant] >= c.DailyTokens {
		return false
	}
	b := l.bucketsOf(tenant)
	now, share := l.now(), l.share()
	if c.RPM > 0 && b.calls.fill(now, c.RPM*share) < 1 {
		return false
	}
	if c.TPM > 0 && b.tokens.fill(now, c.TPM*share) <= 0 {
		return false
	}
	return true
}

// take books an admitted call of estimate tokens.
func (l *tenantLimits) take(tenant string, estimate int) {
	c, ok := l.cfg[tenant]
	if !ok || (c.RPM <= 0 && c.TPM <= 0) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucketsOf(tenant)
	b.calls.level--
	b.tokens.level -= float64(estimate)
}

// settle books what a call really used: its tokens beyond the estimate
// against the TPM cap, and all of them against the daily budget.
func (l *tenantLimits) settle(tenant string, estimate, used int) {
	c, ok := l.cfg[tenant]
	if !ok || (c.TPM <= 0 && c.DailyTokens <= 0) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.TPM > 0 {
		l.bucketsOf(tenant).tokens.level -= float64(used - estimate)
	}
	if c.DailyTokens > 0 {
		l.used[tenant] += int64(used)
	}
}

func (l *tenantLimits) bucketsOf(tenant string) *tenantBuckets {
	b := l.buckets[tenant]
	if b == nil {
		b = &tenantBuckets{}
		now := l.now()
		c := l.cfg[tenant]
		share := l.share()
		b.calls = bucket{level: burst(c.RPM * share), at: now}
		b.tokens = bucket{level: burst(c.TPM * share), at: now}
		l.buckets[tenant] = b
	}
	return b
}

// burst is the bucket's capacity for a per-minute rate: ten seconds of it,
// at least one.
func burst(perMinute float64) float64 { return max(perMinute/6, 1) }

// fill refills the bucket for a per-minute rate up to now and returns its
// level.
func (b *bucket) fill(now time.Time, perMinute float64) float64 {
	if el := now.Sub(b.at).Seconds(); el > 0 {
		b.level = min(b.level+el*perMinute/60, burst(perMinute))
		b.at = now
	}
	return b.level
}

// refresh re-reads today's usage for the daily budgets until ctx ends.
func (l *tenantLimits) refresh(ctx context.Context) {
	if l.usage == nil || !l.budgeted() {
		return
	}
	tick := time.NewTicker(usageEvery)
	defer tick.Stop()
	for {
		l.readUsage(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (l *tenantLimits) budgeted() bool {
	for _, c := range l.cfg {
		if c.DailyTokens > 0 {
			return true
		}
	}
	return false
}

func (l *tenantLimits) readUsage(ctx context.Context) {
	used, err := l.usage(ctx)
	if err != nil {
		l.log.Warn("read tenant usage for daily budgets", "error", err)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.used = used
}
