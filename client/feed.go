package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// maxGetMany is how many ids one GET /v1/jobs?ids= may name.
const maxGetMany = 100

// GetMany returns the statuses of the jobs among ids, in the order of ids;
// an id with no job of the tenant is absent. More than 100 ids take one
// request per 100.
func (c *Client) GetMany(ctx context.Context, ids []string) ([]JobStatus, error) {
	out := make([]JobStatus, 0, len(ids))
	for from := 0; from < len(ids); from += maxGetMany {
		chunk := ids[from:min(len(ids), from+maxGetMany)]
		var page struct {
			Jobs []JobStatus `json:"jobs"`
		}
		if err := c.call(ctx, http.MethodGet, "/v1/jobs?ids="+url.QueryEscape(strings.Join(chunk, ",")), nil, &page); err != nil {
			return out, fmt.Errorf("llmq: get %d jobs: %w", len(chunk), err)
		}
		for _, st := range page.Jobs {
			out = append(out, st.normalized())
		}
	}
	return out, nil
}

// FinishedPage is one answer of the feed of finished jobs.
type FinishedPage struct {
	// Jobs finished after the cursor asked with, in the order they
	// finished; a job replayed and finished again comes again.
	Jobs []JobStatus `json:"jobs"`
	// NextCursor is the cursor to ask with next; with no new job it is the
	// one asked with. Keep it (durably, to resume after a restart).
	NextCursor string `json:"next_cursor"`
}

// Finished returns the tenant's jobs that finished after cursor ("" for
// the beginning), at most limit (0: the API's default), only those in
// statuses when given (terminal statuses). Call it again with NextCursor
// to follow the feed: it never skips or repeats a finish.
func (c *Client) Finished(ctx context.Context, cursor string, limit int, statuses ...Status) (FinishedPage, error) {
	q := url.Values{"finished_after": {cursor}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if len(statuses) > 0 {
		s := make([]string, len(statuses))
		for i, st := range statuses {
			s[i] = string(st)
		}
		q.Set("status", strings.Join(s, ","))
	}
	var page FinishedPage
	if err := c.call(ctx, http.MethodGet, "/v1/jobs?"+q.Encode(), nil, &page); err != nil {
		return page, fmt.Errorf("llmq: finished jobs: %w", err)
	}
	for i := range page.Jobs {
		page.Jobs[i] = page.Jobs[i].normalized()
	}
	return page, nil
}
