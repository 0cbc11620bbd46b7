package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
)

// authenticator maps bearer keys to tenants without leaking, through timing,
// which key (or how much of one) matched: it compares SHA-256 digests of the
// presented key against every configured key, in constant time, and never
// stops early.
type authenticator struct {
	keys []keyEntry
}

type keyEntry struct {
	digest [sha256.Size]byte
	who    principal
}

// principal is who a request acts as: one tenant, or an admin, who acts for
// every tenant (admin_keys).
type principal struct {
	Tenant string
	Admin  bool
}

type principalKey struct{}

// principalOf is the principal the authenticated middleware stored in r's
// context (the zero principal when there is none).
func principalOf(r *http.Request) principal {
	p, _ := r.Context().Value(principalKey{}).(principal)
	return p
}

func newAuthenticator(keys config.APIKeys, adminKeys []config.Secret) *authenticator {
	a := &authenticator{}
	for k, tenant := range keys {
		a.keys = append(a.keys, keyEntry{digest: sha256.Sum256([]byte(k.Reveal())), who: principal{Tenant: tenant}})
	}
	for _, k := range adminKeys {
		a.keys = append(a.keys, keyEntry{digest: sha256.Sum256([]byte(k.Reveal())), who: principal{Tenant: job.DefaultTenant, Admin: true}})
	}
	return a
}

// open reports whether no keys are configured (loopback-only mode).
func (a *authenticator) open() bool { return len(a.keys) == 0 }

// principal returns who the request's bearer key belongs to. With no keys
// configured (loopback only) every request is an admin of tenant default.
func (a *authenticator) principal(r *http.Request) (principal, bool) {
	if a.open() {
		return principal{Tenant: job.DefaultTenant, Admin: true}, true
	}
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return principal{}, false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(h[len(prefix):])))
	found := 0
	var who principal
	for _, k := range a.keys {
		eq := subtle.ConstantTimeCompare(got[:], k.digest[:])
		if eq == 1 {
			who = k.who
		}
		found |= eq
	}
	return who, found == 1
}
