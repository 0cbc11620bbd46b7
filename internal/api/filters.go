package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// The console's filters on the lists (GET /v1/jobs, GET /v1/dlq, POST
// /v1/dlq/replay). Each answers 400 naming its parameter when malformed.

// allTenants, as ?tenant=, lists every tenant's jobs or dead letters: an
// admin key only, on the routes listAllTenants names.
const allTenants = "*"

// listAllTenants are the routes where an admin may name every tenant.
var listAllTenants = map[string]bool{
	"GET /v1/jobs":        true,
	"GET /v1/dlq":         true,
	"POST /v1/dlq/replay": true,
}

// parseTimeParam reads an RFC 3339 time; zero when absent.
func parseTimeParam(r *http.Request, name string) (time.Time, *errorResponse) {
	raw := r.URL.Query().Get(name)
	if raw == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, raw)
	if err != nil {
		return time.Time{}, badQuery(name, name+" must be an RFC 3339 time such as 2026-12-01T09:00:00Z")
	}
	return t, nil
}

// parseTimeRange reads the [after, before) pair of parameters.
func parseTimeRange(r *http.Request, afterName, beforeName string) (after, before time.Time, e *errorResponse) {
	if after, e = parseTimeParam(r, afterName); e != nil {
		return
	}
	before, e = parseTimeParam(r, beforeName)
	return
}

// parseMeta reads ?meta=key:value into the objects one of which the job's
// metadata must contain: {"key": "value"}, and {"key": value} too when the
// value reads as a JSON number or boolean, so that meta=ticket:4711 finds
// {"ticket": 4711} as well as {"ticket": "4711"}.
func parseMeta(r *http.Request) ([]json.RawMessage, *errorResponse) {
	raw := r.URL.Query().Get("meta")
	if raw == "" {
		return nil, nil
	}
	key, value, ok := strings.Cut(raw, ":")
	if !ok || key == "" {
		return nil, badQuery("meta", "meta must be key:value")
	}
	asString, _ := json.Marshal(map[string]string{key: value}) // strings always encode
	out := []json.RawMessage{asString}
	var scalar any
	if err := json.Unmarshal([]byte(value), &scalar); err == nil {
		switch scalar.(type) {
		case float64, bool:
			b, _ := json.Marshal(map[string]json.RawMessage{key: json.RawMessage(value)})
			out = append(out, b)
		}
	}
	return out, nil
}

// jobListFilter reads GET /v1/jobs's filters for the acting tenant.
func jobListFilter(r *http.Request, tenant string) (store.ListFilter, *errorResponse) {
	q := r.URL.Query()
	f := store.ListFilter{Tenant: tenant, AllTenants: tenant == allTenants, Cursor: q.Get("cursor"),
		Model: q.Get("model"), ID: q.Get("id")}
	var e *errorResponse
	if raw := q.Get("status"); raw != "" {
		f.Status = job.Status(raw)
		if !f.Status.Valid() {
			return f, badQuery("status", "status must be one of queued, running, retrying, succeeded, failed, dead, cancelled")
		}
	}
	switch q.Get("order") {
	case "", "asc":
	case "desc":
		f.Desc = true
	default:
		return f, badQuery("order", "order must be asc (oldest first) or desc (newest first)")
	}
	if f.ID != "" && !job.ValidID(f.ID) {
		return f, badQuery("id", "id must be 1 to 128 letters, digits, '.', '_', ':' or '-'")
	}
	if f.Metadata, e = parseMeta(r); e != nil {
		return f, e
	}
	if f.CreatedAfter, f.CreatedBefore, e = parseTimeRange(r, "created_after", "created_before"); e != nil {
		return f, e
	}
	if f.Limit, e = parseLimit(r); e != nil {
		return f, e
	}
	return f, nil
}

// deadLetterFilter reads the dead-letter filters for the acting tenant.
func deadLetterFilter(r *http.Request, tenant string) (store.DeadLetterFilter, *errorResponse) {
	q := r.URL.Query()
	f := store.DeadLetterFilter{Tenant: tenant, AllTenants: tenant == allTenants, Reason: q.Get("reason"),
		Model: q.Get("model"), Cursor: q.Get("cursor")}
	var e *errorResponse
	if f.FailedAfter, f.FailedBefore, e = parseTimeRange(r, "failed_after", "failed_before"); e != nil {
		return f, e
	}
	return f, nil
}

// parseBool reads a boolean parameter; false when absent.
func parseBool(r *http.Request, name string) (bool, *errorResponse) {
	raw := r.URL.Query().Get(name)
	if raw == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(raw)
	if err != nil {
		return false, badQuery(name, name+" must be true or false")
	}
	return b, nil
}
