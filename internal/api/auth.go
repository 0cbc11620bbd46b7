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
	tenant string
}

func newAuthenticator(keys config.APIKeys) *authenticator {
	a := &authenticator{}
	for k, tenant := range keys {
		a.keys = append(a.keys, keyEntry{digest: sha256.Sum256([]byte(k.Reveal())), tenant: tenant})
	}
	return a
}

// open reports whether no keys are configured (loopback-only mode).
func (a *authenticator) open() bool { return len(a.keys) == 0 }

// tenant returns the tenant of the request's bearer key.
func (a *authenticator) tenant(r *http.Request) (string, bool) {
	if a.open() {
		return job.DefaultTenant, true
	}
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(h[len(prefix):])))
	found := 0
	tenant := ""
	for _, k := range a.keys {
		eq := subtle.ConstantTimeCompare(got[:], k.digest[:])
		if eq == 1 {
			tenant = k.tenant
		}
		found |= eq
	}
	return tenant, found == 1
}
