package webhook_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/webhook"
)

// TestSignMatchesTheSpecVector holds Sign to the test vector the Standard
// Webhooks specification publishes: a receiver's stock library must accept
// what llmq sends.
func TestSignMatchesTheSpecVector(t *testing.T) {
	key, err := config.DecodeWebhookSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	require.NoError(t, err)
	got := webhook.Sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	assert.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", got)
}

func TestSetHeadersVerifyWithTheClient(t *testing.T) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	key, err := config.DecodeWebhookSecret(secret)
	require.NoError(t, err)
	at := time.Unix(1700000000, 0)
	body := []byte(`{"type":"job.succeeded"}`)
	h := http.Header{}
	webhook.SetHeaders(h, key, "0b9c2f55-0d2a-4b4e-9d6c-3c2b1f9b7a11", at, body)
	assert.Equal(t, "0b9c2f55-0d2a-4b4e-9d6c-3c2b1f9b7a11", h.Get("webhook-id"))
	assert.Equal(t, "1700000000", h.Get("webhook-timestamp"))
	require.NoError(t, client.VerifyWebhook(secret, h, body, at.Add(time.Minute)))
	assert.ErrorIs(t, client.VerifyWebhook("whsec_"+"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", h, body, at), client.ErrWebhookSignature)
}
