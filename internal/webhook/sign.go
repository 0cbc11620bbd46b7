package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"time"
)

// Headers of a Standard Webhooks delivery.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Sign returns the webhook-signature value of one attempt: "v1," and the
// base64 HMAC-SHA256, under key (the decoded secret, without "whsec_"),
// of "{msgID}.{unix seconds}.{body}".
func Sign(key []byte, msgID string, at time.Time, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(msgID))
	mac.Write([]byte{'.'})
	mac.Write([]byte(strconv.FormatInt(at.Unix(), 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// SetHeaders sets the three signature headers of an attempt made at at.
func SetHeaders(h http.Header, key []byte, msgID string, at time.Time, body []byte) {
	// Set, not Add: the spec's names are lower case, and http.Header
	// canonicalises them; receivers read them case-insensitively.
	h.Set(HeaderID, msgID)
	h.Set(HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
	h.Set(HeaderSignature, Sign(key, msgID, at, body))
}
