package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// UsageQuery selects and groups GET /v1/usage.
type UsageQuery struct {
	// From and To bound the UTC hours counted (an hour counts when it
	// starts in [From, To)); zero means the last 24 hours.
	From, To time.Time
	// GroupBy is any of "tenant", "model", "day", "hour" (day or hour, not
	// both); empty sums everything into one row.
	GroupBy []string
	// Tenant picks one tenant (an admin key; a tenant key sees only its own).
	Tenant string
}

// UsageCounts are the provider calls recorded on jobs and their cost at
// the configured prices.
type UsageCounts struct {
	// Calls counts successes, 429s and other failed calls.
	Calls        int64   `json:"calls"`
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	RateLimited  int64   `json:"rate_limited"`
	Failed       int64   `json:"failed"`
	Cost         float64 `json:"cost"`
}

// UsageRow is one group of a UsageReport; the keys not grouped by are empty.
type UsageRow struct {
	Tenant string `json:"tenant,omitempty"`
	Model  string `json:"model,omitempty"`
	// Start is the UTC day or hour of the row (GroupBy day or hour).
	Start *time.Time `json:"start,omitempty"`
	UsageCounts
}

// UsageReport is the answer of GET /v1/usage.
type UsageReport struct {
	From    time.Time   `json:"from"`
	To      time.Time   `json:"to"`
	GroupBy []string    `json:"group_by"`
	Rows    []UsageRow  `json:"rows"`
	Totals  UsageCounts `json:"totals"`
	// UnpricedModels have no price in the configuration; they cost 0.
	UnpricedModels []string `json:"unpriced_models,omitempty"`
}

// Usage returns calls, tokens, 429s, failures and cost (GET /v1/usage).
// A bad query is an *APIError with Code CodeInvalidRequest naming the field.
func (c *Client) Usage(ctx context.Context, q UsageQuery) (UsageReport, error) {
	v := url.Values{}
	if !q.From.IsZero() {
		v.Set("from", q.From.Format(time.RFC3339))
	}
	if !q.To.IsZero() {
		v.Set("to", q.To.Format(time.RFC3339))
	}
	if len(q.GroupBy) > 0 {
		v.Set("group_by", strings.Join(q.GroupBy, ","))
	}
	if q.Tenant != "" {
		v.Set("tenant", q.Tenant)
	}
	path := "/v1/usage"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var r UsageReport
	if err := c.call(ctx, http.MethodGet, path, nil, &r); err != nil {
		return r, fmt.Errorf("llmq: get usage: %w", err)
	}
	return r, nil
}
