// Package webhook owns llmq's webhook deliveries from the moment the result
// relay writes a webhook_deliveries row (one per result event and endpoint)
// until the row is delivered or dead (docs/webhooks.md):
//
//   - signing, as the Standard Webhooks specification says: webhook-id (the
//     event id, the same on every retry), webhook-timestamp and
//     webhook-signature, an HMAC-SHA256 with the tenant's secret;
//   - a safe HTTP client that dials only public addresses (checked on the
//     address actually dialled, so DNS rebinding cannot get past it),
//     follows no redirect, bounds each attempt's time and reads at most a
//     capped part of the answer;
//   - the Dispatcher, which claims due deliveries from Postgres (several
//     consumers run one each), sends them with bounded concurrency and
//     records each attempt: delivered on a 2xx, otherwise retried with
//     backoff until the retry window (webhooks.retry_for, at least 24h)
//     ends and the delivery is dead.
//
// Secrets never leave this package except as signatures: they are not
// logged, stored or put in errors.
package webhook
