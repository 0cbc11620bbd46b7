package client

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// WebhookTolerance is how far a webhook's timestamp may lie from the
// receiver's clock, either way, before VerifyWebhook refuses it as a
// replay (or a clock too far off).
const WebhookTolerance = 5 * time.Minute

// Reasons VerifyWebhook refuses a delivery; find them with errors.Is.
var (
	// ErrWebhookSecret: the secret is not "whsec_" and base64.
	ErrWebhookSecret = errors.New("invalid webhook secret")
	// ErrWebhookHeaders: webhook-id, webhook-timestamp or
	// webhook-signature is missing or malformed.
	ErrWebhookHeaders = errors.New("missing or malformed webhook headers")
	// ErrWebhookTimestamp: webhook-timestamp is outside WebhookTolerance.
	ErrWebhookTimestamp = errors.New("webhook timestamp outside the tolerance")
	// ErrWebhookSignature: no signature matches (a wrong secret, or a
	// body changed on the way).
	ErrWebhookSignature = errors.New("no matching webhook signature")
)

// WebhookError is why VerifyWebhook refused a delivery: Reason is one of
// the ErrWebhook* errors, Detail says more. It never contains the secret.
type WebhookError struct {
	Reason error
	Detail string
}

func (e *WebhookError) Error() string {
	if e.Detail == "" {
		return "webhook: " + e.Reason.Error()
	}
	return "webhook: " + e.Reason.Error() + ": " + e.Detail
}

// Unwrap returns Reason.
func (e *WebhookError) Unwrap() error { return e.Reason }

// VerifyWebhook checks a webhook llmq sent, as the Standard Webhooks
// specification says: webhook-timestamp within WebhookTolerance of now,
// and one of the space-separated "v1,<base64>" entries of
// webhook-signature equal (compared in constant time) to the HMAC-SHA256,
// keyed with the secret's decoded bytes, of
// "{webhook-id}.{webhook-timestamp}.{body}".
//
// secret is the tenant's webhook secret, "whsec_" and base64 (the prefix
// may be left out). body must be the request body exactly as received,
// before any JSON decoding. A nil error means the delivery is llmq's; a
// receiver then dedupes by webhook-id, which is the same on every retry of
// an event. On error answer 401: a *WebhookError is never worth retrying
// with the same secret.
func VerifyWebhook(secret string, header http.Header, body []byte, now time.Time) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || len(key) == 0 {
		return &WebhookError{Reason: ErrWebhookSecret, Detail: `want "whsec_" followed by standard base64`}
	}
	id, ts, sigs := header.Get("webhook-id"), header.Get("webhook-timestamp"), header.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return &WebhookError{Reason: ErrWebhookHeaders, Detail: "webhook-id, webhook-timestamp and webhook-signature are required"}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return &WebhookError{Reason: ErrWebhookHeaders, Detail: "webhook-timestamp is not unix seconds"}
	}
	if d := now.Sub(time.Unix(sec, 0)); d > WebhookTolerance || d < -WebhookTolerance {
		return &WebhookError{Reason: ErrWebhookTimestamp, Detail: "timestamp " + ts + " is " + d.Round(time.Second).String() + " from now"}
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, entry := range strings.Fields(sigs) {
		version, sig, ok := strings.Cut(entry, ",")
		if !ok || version != "v1" {
			continue // another scheme (e.g. v1a, asymmetric): not ours
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return &WebhookError{Reason: ErrWebhookSignature}
}
