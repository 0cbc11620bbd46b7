package broker

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/llmq/llmq/internal/job"
)

// Reasons of the messages the broker-identity rule refuses (the dead
// letter's reason); they name the rule, never a credential.
const (
	// ReasonIdentityMismatch: the publisher's identity belongs to one
	// tenant and the body names another.
	ReasonIdentityMismatch = identityReason + "the publisher belongs to tenant %q, the body names tenant %q"
	// ReasonIdentityRequired: the body names a tenant that takes raw
	// publishes only from its own broker identity.
	ReasonIdentityRequired = identityReason + "tenant %q takes raw publishes only from its broker_users " +
		"(RabbitMQ user_id) or its own Kafka topics llmq.jobs.<priority>.%s"

	identityReason = "broker identity: "
)

// RefusedByIdentity reports whether a dead letter's reason is the identity
// rule's refusal: its body is no tenant's word, whichever tenant it is
// filed under.
func RefusedByIdentity(reason string) bool { return strings.HasPrefix(reason, identityReason) }

// Identity decides the tenant of an intake message from what the broker
// vouches for (docs/design.md#broker-identity): the RabbitMQ user_id,
// which RabbitMQ checks against the publishing connection's user, or the
// tenant's own Kafka topic, which only its principals may write under the
// topic ACLs. The body's tenant counts only where no identity applies.
// The ingester judges every message by it, and the reconciler a message
// the broker dead-lettered from the intake before it was stored.
type Identity struct {
	users   map[string]string // broker user → tenant
	guarded map[string]bool   // tenants that have broker users
}

// NewIdentity is the rule for users, broker user → tenant.
func NewIdentity(users map[string]string) Identity {
	id := Identity{users: users, guarded: map[string]bool{}}
	for _, t := range users {
		id.guarded[t] = true
	}
	return id
}

// TenantOf returns the tenant msg's identity gives its job ("" when none
// does: the body's tenant stands), or, for a message the rule refuses, the
// reason and the tenant its dead letter is filed under: the publisher's
// own, never the one the body claims, so a refused message touches nothing
// of the claimed tenant.
func (id Identity) TenantOf(msg Message) (tenant, refusal, fileUnder string) {
	if len(id.guarded) == 0 && msg.IntakeTenant == "" {
		// No broker_users: the body decides, as it always did, and the body
		// is not read twice.
		return "", "", ""
	}
	vouched := msg.IntakeTenant
	if vouched == "" && msg.UserID != "" {
		vouched = id.users[msg.UserID]
	}
	claimed := claimedTenant(msg.Body)
	if vouched != "" {
		if claimed != "" && claimed != vouched {
			return "", fmt.Sprintf(ReasonIdentityMismatch, vouched, claimed), vouched
		}
		return vouched, "", ""
	}
	effective := claimed
	if effective == "" {
		effective = job.DefaultTenant
	}
	if id.guarded[effective] {
		return "", fmt.Sprintf(ReasonIdentityRequired, effective, effective), job.DefaultTenant
	}
	return "", "", ""
}

// Guarded reports whether tenant takes raw publishes only from its own
// broker identity: a body that names it, read by another reader than
// TenantOf's, is no word of the tenant's unless an identity vouched.
func (id Identity) Guarded(tenant string) bool { return id.guarded[tenant] }

// claimedTenant reads the tenant a job body names ("" when it names none
// or the body is not a JSON object); a tenant that is not a string counts
// as none here, and the job's validation refuses it.
func claimedTenant(body []byte) string {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return ""
	}
	var t string
	if raw, ok := fields["tenant"]; !ok || json.Unmarshal(raw, &t) != nil {
		return ""
	}
	return t
}
