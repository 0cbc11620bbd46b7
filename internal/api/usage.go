package api

import (
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// UsageCounts are the calls and tokens of a group of GET /v1/usage and
// their cost at the configured prices (models.<m>.price).
type UsageCounts struct {
	// Calls are the provider answers recorded on jobs: successes, 429s and
	// other failed calls.
	Calls        int64 `json:"calls"`
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	RateLimited  int64 `json:"rate_limited"`
	Failed       int64 `json:"failed"`
	// Cost is the tokens at the price table; a model without a price costs 0.
	Cost float64 `json:"cost"`
}

func (c *UsageCounts) add(o UsageCounts) {
	c.Calls += o.Calls
	c.InputTokens += o.InputTokens
	c.OutputTokens += o.OutputTokens
	c.RateLimited += o.RateLimited
	c.Failed += o.Failed
	c.Cost += o.Cost
}

// UsageGroup is one row of GET /v1/usage: the counts of one combination of
// the group_by keys (a key not grouped by is left out).
type UsageGroup struct {
	Tenant string `json:"tenant,omitempty"`
	Model  string `json:"model,omitempty"`
	// Start is the UTC day or hour the row covers (group_by day or hour).
	Start *time.Time `json:"start,omitempty"`
	UsageCounts
}

// UsageResponse is the body of GET /v1/usage.
type UsageResponse struct {
	From    time.Time    `json:"from"`
	To      time.Time    `json:"to"`
	GroupBy []string     `json:"group_by"`
	Rows    []UsageGroup `json:"rows"`
	Totals  UsageCounts  `json:"totals"`
	// UnpricedModels are models in the answer that have no price in the
	// configuration; their cost is counted as 0.
	UnpricedModels []string `json:"unpriced_models,omitempty"`
}

// usageGroupKeys are the values group_by accepts.
var usageGroupKeys = []string{"tenant", "model", "day", "hour"}

// usageQuery is a parsed GET /v1/usage.
type usageQuery struct {
	filter  store.UsageFilter
	groupBy []string
	byModel bool
}

// parseUsageQuery reads from, to (RFC 3339; default the last 24 hours),
// group_by and tenant. A tenant key sees only its own tenant; an admin sees
// every tenant and may name one.
func (s *Server) parseUsageQuery(r *http.Request, who principal) (usageQuery, *errorResponse) {
	q := r.URL.Query()
	now := s.now()
	var u usageQuery
	u.filter.To = now
	u.filter.From = now.Add(-24 * time.Hour)
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"from", &u.filter.From}, {"to", &u.filter.To}} {
		if raw := q.Get(p.name); raw != "" {
			t, err := time.Parse(time.RFC3339, raw)
			if err != nil {
				return u, badQuery(p.name, p.name+" must be an RFC 3339 time such as 2026-12-01T00:00:00Z")
			}
			*p.dst = t
		}
	}
	if !u.filter.From.Before(u.filter.To) {
		return u, badQuery("from", "from must be before to")
	}
	u.groupBy = []string{}
	if raw := q.Get("group_by"); raw != "" {
		for _, k := range strings.Split(raw, ",") {
			k = strings.TrimSpace(k)
			if !slices.Contains(usageGroupKeys, k) {
				return u, badQuery("group_by", "group_by is a comma-separated list of tenant, model, day, hour")
			}
			if !slices.Contains(u.groupBy, k) {
				u.groupBy = append(u.groupBy, k)
			}
		}
	}
	u.filter.ByTenant = slices.Contains(u.groupBy, "tenant")
	u.byModel = slices.Contains(u.groupBy, "model")
	switch day, hour := slices.Contains(u.groupBy, "day"), slices.Contains(u.groupBy, "hour"); {
	case day && hour:
		return u, badQuery("group_by", "group_by takes day or hour, not both")
	case day:
		u.filter.Period = store.PeriodDay
	case hour:
		u.filter.Period = store.PeriodHour
	}
	tenant := q.Get("tenant")
	switch {
	case who.Admin:
		u.filter.OnlyTenant = tenant
	case tenant != "" && tenant != who.Tenant:
		return u, badQuery("tenant", "a tenant key sees only its own usage; only an admin key may name another tenant")
	default:
		u.filter.OnlyTenant = who.Tenant
	}
	return u, nil
}

func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request, _ string) {
	who := principalOf(r)
	u, e := s.parseUsageQuery(r, who)
	if e != nil {
		writeError(w, e)
		return
	}
	rows, err := s.store.Usage(r.Context(), u.filter)
	if err != nil {
		writeError(w, s.storeError("usage", job.Key{Tenant: who.Tenant}, err))
		return
	}
	writeJSON(w, http.StatusOK, usageResponse(u, rows, s.models))
}

// priceModel is the model whose price a usage row's model pays: a batch's
// calls ("<model>@batch", store.BatchUsageSuffix) pay the model's price
// less its batch discount.
func priceModel(models map[string]config.Model, name string) (config.Model, bool) {
	if m, ok := models[name]; ok {
		return m, true
	}
	base, isBatch := strings.CutSuffix(name, store.BatchUsageSuffix)
	m, ok := models[base]
	if !isBatch || !ok {
		return config.Model{}, false
	}
	keep := 1 - m.Batch.Discount
	m.Price = config.Price{InputPerMillion: m.Price.InputPerMillion * keep, OutputPerMillion: m.Price.OutputPerMillion * keep}
	return m, true
}

// usageResponse prices the store's rows (always per model) and merges
// them over the model when the query does not group by it.
func usageResponse(u usageQuery, rows []store.UsageRow, models map[string]config.Model) UsageResponse {
	resp := UsageResponse{From: u.filter.From, To: u.filter.To, GroupBy: u.groupBy, Rows: []UsageGroup{}}
	unpriced := map[string]bool{}
	type key struct {
		tenant, model string
		start         time.Time
	}
	index := map[key]int{}
	for _, row := range rows {
		m, ok := priceModel(models, row.Model)
		if !ok || m.Price == (config.Price{}) {
			unpriced[row.Model] = true
		}
		c := UsageCounts{Calls: row.Calls, InputTokens: row.InputTokens, OutputTokens: row.OutputTokens,
			RateLimited: row.RateLimited, Failed: row.Failed, Cost: m.Price.Cost(row.InputTokens, row.OutputTokens)}
		resp.Totals.add(c)
		k := key{tenant: row.Tenant, start: row.Start}
		if u.byModel {
			k.model = row.Model
		}
		i, seen := index[k]
		if !seen {
			g := UsageGroup{Tenant: k.tenant, Model: k.model}
			if u.filter.Period != store.PeriodNone {
				start := row.Start
				g.Start = &start
			}
			i = len(resp.Rows)
			index[k] = i
			resp.Rows = append(resp.Rows, g)
		}
		resp.Rows[i].add(c)
	}
	for m := range unpriced {
		resp.UnpricedModels = append(resp.UnpricedModels, m)
	}
	sort.Strings(resp.UnpricedModels)
	return resp
}
