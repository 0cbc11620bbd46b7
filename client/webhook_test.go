package client_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/client"
)

// The Standard Webhooks specification's published test vector.
const (
	vecSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vecID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vecTimestamp = "1614265330"
	vecSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	vecBody      = `{"test": 2432232314}`
)

var vecTime = time.Unix(1614265330, 0)

func vecHeader(sig string) http.Header {
	h := http.Header{}
	h.Set("webhook-id", vecID)
	h.Set("webhook-timestamp", vecTimestamp)
	h.Set("webhook-signature", sig)
	return h
}

func TestVerifyWebhookAcceptsTheSpecVector(t *testing.T) {
	require.NoError(t, client.VerifyWebhook(vecSecret, vecHeader(vecSignature), []byte(vecBody), vecTime))
	// Without the prefix, and among other signatures (a rotation), and at
	// the edges of the tolerance.
	require.NoError(t, client.VerifyWebhook(vecSecret[len("whsec_"):], vecHeader(vecSignature), []byte(vecBody), vecTime))
	several := "v1,bm9wZQ== v1a,ignored " + vecSignature
	require.NoError(t, client.VerifyWebhook(vecSecret, vecHeader(several), []byte(vecBody), vecTime.Add(client.WebhookTolerance)))
	require.NoError(t, client.VerifyWebhook(vecSecret, vecHeader(vecSignature), []byte(vecBody), vecTime.Add(-client.WebhookTolerance)))
}

func TestVerifyWebhookRefuses(t *testing.T) {
	other := "whsec_" + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	noID := vecHeader(vecSignature)
	noID.Del("webhook-id")
	badTS := vecHeader(vecSignature)
	badTS.Set("webhook-timestamp", "yesterday")
	for _, tc := range []struct {
		name   string
		secret string
		header http.Header
		body   string
		now    time.Time
		want   error
	}{
		{"wrong secret", other, vecHeader(vecSignature), vecBody, vecTime, client.ErrWebhookSignature},
		{"changed body", vecSecret, vecHeader(vecSignature), `{"test": 2432232315}`, vecTime, client.ErrWebhookSignature},
		{"changed id", vecSecret, func() http.Header { h := vecHeader(vecSignature); h.Set("webhook-id", "msg_x"); return h }(), vecBody, vecTime, client.ErrWebhookSignature},
		{"only another scheme", vecSecret, vecHeader("v2," + vecSignature[3:]), vecBody, vecTime, client.ErrWebhookSignature},
		{"too old", vecSecret, vecHeader(vecSignature), vecBody, vecTime.Add(client.WebhookTolerance + time.Second), client.ErrWebhookTimestamp},
		{"too new", vecSecret, vecHeader(vecSignature), vecBody, vecTime.Add(-client.WebhookTolerance - time.Second), client.ErrWebhookTimestamp},
		{"missing id", vecSecret, noID, vecBody, vecTime, client.ErrWebhookHeaders},
		{"bad timestamp", vecSecret, badTS, vecBody, vecTime, client.ErrWebhookHeaders},
		{"bad secret", "whsec_not base64!", vecHeader(vecSignature), vecBody, vecTime, client.ErrWebhookSecret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := client.VerifyWebhook(tc.secret, tc.header, []byte(tc.body), tc.now)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.want)
			var we *client.WebhookError
			require.True(t, errors.As(err, &we), "typed error")
			assert.NotContains(t, err.Error(), "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "the error never shows the secret")
		})
	}
}
