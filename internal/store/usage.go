package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Usage is rolled up in usage_hours (migrations/00022_usage.sql) by the
// statements that record a provider answer on a job, never apart from them:
// a success by Complete and CompleteBatch, a failed call by the transitions
// that append an error entry whose Call is set (Fail, ScheduleRetry,
// DeferRateLimited, MarkDead, MarkDeadLettered). So the rollup always equals
// what the job rows say: per job, one call on model_used with its tokens
// when it succeeded, plus one call per error entry with a Call, on that
// entry's model.

// How a call that did not succeed ended (AttemptError.Call).
const (
	CallRateLimited = "rate_limited"
	CallFailed      = "failed"
)

// usageShard is the shard a statement adds to: one (hour, tenant, model)
// is spread over 16 rows by the writing backend's pid, so concurrent
// completion batches of one tenant and model (each on its own connection)
// seldom wait on one another's row lock. Readers sum the shards.
const usageShard = `(pg_backend_pid() % 16)::smallint`

// usageUpsert ends an INSERT INTO usage_hours AS h: a row that exists is
// added to.
const usageUpsert = ` ON CONFLICT (bucket, tenant, model, shard) DO UPDATE SET
	calls = h.calls + EXCLUDED.calls, input_tokens = h.input_tokens + EXCLUDED.input_tokens,
	output_tokens = h.output_tokens + EXCLUDED.output_tokens,
	rate_limited = h.rate_limited + EXCLUDED.rate_limited, failed = h.failed + EXCLUDED.failed`

// successUsage is the CTE that adds the successes of the CTE done (columns
// tenant, model_used, prompt_tokens, completion_tokens) to the hour of
// now(), which is their completed_at. Rows go in key order, so concurrent
// batches lock shared rows in one order.
const successUsage = `used AS (INSERT INTO usage_hours AS h (bucket, tenant, model, shard, calls, input_tokens, output_tokens)
		SELECT date_trunc('hour', now(), 'UTC'), done.tenant, done.model_used, ` + usageShard + `,
			count(*), sum(done.prompt_tokens), sum(done.completion_tokens)
		FROM done GROUP BY done.tenant, done.model_used ORDER BY done.tenant, done.model_used` + usageUpsert + `)`

// failedCallUsage returns the CTE that adds one failed call of e to the
// hour of e.At when the CTE done (column tenant) returned the job, with
// its parameters numbered from first; ok is false when e records no call.
func failedCallUsage(e AttemptError, first int) (cte string, args []any, ok bool) {
	var limited, failed int
	switch e.Call {
	case CallRateLimited:
		limited = 1
	case CallFailed:
		failed = 1
	default:
		return "", nil, false
	}
	p := func(i int) string { return "$" + strconv.Itoa(first+i) }
	cte = `used AS (INSERT INTO usage_hours AS h (bucket, tenant, model, shard, calls, rate_limited, failed)
		SELECT ` + p(0) + `::timestamptz, done.tenant, ` + p(1) + `, ` + usageShard + `, 1, ` + p(2) + `, ` + p(3) + ` FROM done` +
		usageUpsert + `)`
	return cte, []any{usageBucket(e.At), e.Model, limited, failed}, true
}

// usageBucket is the start of t's UTC hour.
func usageBucket(t time.Time) time.Time { return t.UTC().Truncate(time.Hour) }

// Period is the time grouping of a usage query.
type Period string

// Periods of a usage query.
const (
	PeriodNone Period = ""
	PeriodHour Period = "hour"
	PeriodDay  Period = "day"
)

// UsageFilter selects and groups usage. Rows are always per model (a
// price is per model); Tenant and Period add to the grouping.
type UsageFilter struct {
	// From and To bound the hours counted: an hour counts when it starts
	// in [From, To).
	From, To time.Time
	// OnlyTenant, when set, counts only that tenant.
	OnlyTenant string
	// ByTenant groups by tenant; Period by UTC hour or day.
	ByTenant bool
	Period   Period
}

// UsageRow is one group of a usage query. Tenant is "" unless grouped by
// tenant; Start is the zero time unless grouped by a period.
type UsageRow struct {
	Tenant       string
	Model        string
	Start        time.Time
	Calls        int64
	InputTokens  int64
	OutputTokens int64
	RateLimited  int64
	Failed       int64
}

// usageOfJobs is every call the job rows record, with the columns of
// usage_hours: a success on model_used in the hour of completed_at, and
// each error entry with a call in the hour of its "at".
const usageOfJobs = `(SELECT date_trunc('hour', completed_at, 'UTC') AS bucket, tenant, model_used AS model,
		1 AS calls, prompt_tokens AS input_tokens, completion_tokens AS output_tokens, 0 AS rate_limited, 0 AS failed
	FROM jobs WHERE status = 'succeeded' AND model_used IS NOT NULL
	UNION ALL
	SELECT date_trunc('hour', (e->>'at')::timestamptz, 'UTC'), j.tenant, e->>'model',
		1, 0, 0, (e->>'call' = 'rate_limited')::int, (e->>'call' = 'failed')::int
	FROM jobs j CROSS JOIN LATERAL jsonb_array_elements(j.errors) AS e WHERE e ? 'call') AS usage_hours`

// Usage sums usage_hours as f asks, ordered by start, tenant and model.
func (s *Store) Usage(ctx context.Context, f UsageFilter) ([]UsageRow, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	return s.usage(ctx, "usage_hours", f)
}

// UsageOfJobs is Usage recomputed from the job rows instead of the
// rollup, for audits and tests: it scans every job, so it is slow on a
// large table, and it misses jobs deleted since.
func (s *Store) UsageOfJobs(ctx context.Context, f UsageFilter) ([]UsageRow, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	return s.usage(ctx, usageOfJobs, f)
}

func (s *Store) usage(ctx context.Context, from string, f UsageFilter) ([]UsageRow, error) {
	tenant, start := `''`, `NULL::timestamptz`
	if f.ByTenant {
		tenant = `tenant`
	}
	switch f.Period {
	case PeriodHour:
		start = `bucket`
	case PeriodDay:
		start = `date_trunc('day', bucket, 'UTC')`
	case PeriodNone:
	default:
		return nil, fmt.Errorf("usage: unknown period %q", f.Period)
	}
	where := []string{`bucket >= $1`, `bucket < $2`}
	args := []any{f.From, f.To}
	if f.OnlyTenant != "" {
		where = append(where, `tenant = $3`)
		args = append(args, f.OnlyTenant)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+tenant+` AS t, model, `+start+` AS s,
			sum(calls)::bigint, sum(input_tokens)::bigint, sum(output_tokens)::bigint,
			sum(rate_limited)::bigint, sum(failed)::bigint
		FROM `+from+` WHERE `+strings.Join(where, " AND ")+`
		GROUP BY 1, 2, 3 ORDER BY 3, 1, 2`, args...)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (UsageRow, error) {
		var u UsageRow
		var st *time.Time
		err := row.Scan(&u.Tenant, &u.Model, &st, &u.Calls, &u.InputTokens, &u.OutputTokens, &u.RateLimited, &u.Failed)
		if st != nil {
			u.Start = st.UTC()
		}
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	return out, nil
}

// TokensToday returns each tenant's tokens (input + output) of the current
// UTC day, over every model, for the daily budgets
// (tenants.<name>.daily_tokens). It reads usage_hours only.
func (s *Store) TokensToday(ctx context.Context) (map[string]int64, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rows, err := s.pool.Query(ctx, `SELECT tenant, sum(input_tokens + output_tokens)::bigint FROM usage_hours
		WHERE bucket >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
		GROUP BY tenant`)
	if err != nil {
		return nil, fmt.Errorf("read tokens of today: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var tenant string
		var n int64
		if err := rows.Scan(&tenant, &n); err != nil {
			return nil, fmt.Errorf("read tokens of today: %w", err)
		}
		out[tenant] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read tokens of today: %w", err)
	}
	return out, nil
}
