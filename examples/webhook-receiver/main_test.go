package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/webhook"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// deliver signs body as llmq's dispatcher does, with signingSecret, and
// posts it to h.
func deliver(t *testing.T, h http.Handler, signingSecret, id string, at time.Time, body string) *httptest.ResponseRecorder {
	t.Helper()
	key, err := config.DecodeWebhookSecret(config.Secret(signingSecret))
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	webhook.SetHeaders(req.Header, key, id, at, []byte(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestReceiverAcceptsSignedAndRefusesWrongSecret(t *testing.T) {
	now := time.Unix(1700000000, 0)
	var out bytes.Buffer
	h := newHandler(secret, func() time.Time { return now }, &out)
	body := `{"type":"job.succeeded","version":1,"event_id":"e1","data":{"id":"j1","tenant":"acme","status":"succeeded"}}`

	rec := deliver(t, h, secret, "e1", now.Add(-time.Minute), body)
	assert.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	assert.Contains(t, out.String(), "job.succeeded job=acme/j1 status=succeeded webhook-id=e1")

	// A retry of the same event is acknowledged, not handled twice.
	rec = deliver(t, h, secret, "e1", now, body)
	assert.Equal(t, http.StatusNoContent, rec.Code)
	assert.Equal(t, 1, strings.Count(out.String(), "webhook-id=e1"))

	// Signed with another secret: refused.
	rec = deliver(t, h, "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "e2", now, body)
	assert.Equal(t, http.StatusUnauthorized, rec.Code)
	assert.Contains(t, rec.Body.String(), "no matching webhook signature")

	// Replayed long after: refused.
	rec = deliver(t, h, secret, "e3", now.Add(-time.Hour), body)
	assert.Equal(t, http.StatusUnauthorized, rec.Code)

	// A body changed on the way: refused.
	key, err := config.DecodeWebhookSecret(secret)
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Replace(body, "succeeded", "failed", 1)))
	webhook.SetHeaders(req.Header, key, "e4", now, []byte(body))
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusUnauthorized, rec.Code)

	assert.NotContains(t, out.String(), "e2")
	assert.NotContains(t, out.String(), "e3")
	assert.NotContains(t, out.String(), "e4")
}
