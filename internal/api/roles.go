package api

import (
	"context"
	"net/http"

	"github.com/llmq/llmq/internal/job"
)

// Roles (docs/design.md#tenants). A tenant key acts for its tenant only:
// it never reads, cancels or replays another tenant's jobs or dead
// letters, and GET /v1/status shows it its own backlog beside the global
// state. An admin key (admin_keys) acts for any tenant: ?tenant= names
// the one it reads or acts on (default: "default"), a submission's body
// "tenant" the one it submits as, and without ?tenant= GET /v1/status
// shows it every tenant, and ?tenant=* lists every tenant's jobs and dead
// letters (listAllTenants). /metrics needs an admin key. With no keys at all
// (loopback only) every request is an admin of tenant "default".

// tenantParam is the query parameter an admin names a tenant with.
const tenantParam = "tenant"

var errForbiddenTenant = apiError(http.StatusForbidden, CodeForbidden, "this key acts for its own tenant only; only an admin key may name another in ?tenant=")

// actingTenant is the tenant a request acts on: ?tenant= for an admin (or
// for a tenant key naming its own), else the key's tenant. A tenant key
// naming another tenant is refused as if what it asked for did not exist
// when it asked for one job or dead letter by id, and 403 otherwise.
func actingTenant(r *http.Request, who principal) (string, *errorResponse) {
	asked := r.URL.Query().Get(tenantParam)
	if asked == "" || asked == who.Tenant {
		return who.Tenant, nil
	}
	if !who.Admin {
		if r.PathValue("id") != "" {
			return "", apiError(http.StatusNotFound, CodeNotFound, notFoundMessage(r))
		}
		return "", errForbiddenTenant
	}
	if asked == allTenants && listAllTenants[r.Pattern] {
		return allTenants, nil
	}
	if !job.ValidTenant(asked) {
		return "", badQuery(tenantParam, "tenant must be 1 to 64 letters, digits, '_' or '-'")
	}
	return asked, nil
}

// notFoundMessage is the message of the route's 404 for a missing object,
// word for word, so that a refused tenant cannot tell the difference.
func notFoundMessage(r *http.Request) string {
	if r.Pattern == "POST /v1/dlq/{id}/replay" {
		return errDeadLetterNotFound.Body.Message
	}
	return errNotFound.Body.Message
}

// submitTenant is the tenant a submitted job belongs to: an admin's job
// names its own (body "tenant"), or takes the request's acting tenant; a
// tenant key's job is its key's (prepare refuses a body naming another).
func submitTenant(r *http.Request, acting string, j job.Job) string {
	if principalOf(r).Admin && j.Tenant != "" {
		return j.Tenant
	}
	return acting
}

// adminOnly serves h to admin keys only (every request, with no keys
// configured: loopback-only mode).
func (s *Server) adminOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, ok := s.auth.principal(r)
		if !ok {
			writeUnauthorized(w)
			return
		}
		if !who.Admin {
			writeError(w, apiError(http.StatusForbidden, CodeForbidden, "this needs an admin key (admin_keys)"))
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, who)))
	})
}

// writeUnauthorized answers a request without a valid key.
func writeUnauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="llmq"`)
	writeError(w, apiError(http.StatusUnauthorized, CodeUnauthorized, "missing or invalid API key (Authorization: Bearer <key>)"))
}
