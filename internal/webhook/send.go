package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/telemetry"
)

// result is the outcome of one attempt.
type result struct {
	status int    // the receiver's HTTP status; 0 if none came
	err    string // why the attempt failed; "" on a 2xx
}

func (r result) ok() bool { return r.err == "" && r.status >= 200 && r.status < 300 }

// snippetBytes is how much of a refusing receiver's answer last_error keeps.
const snippetBytes = 128

// userAgent identifies llmq's webhooks to receivers.
const userAgent = "llmq-webhook/1"

// send POSTs del's payload, signed for an attempt at at, and reads at most
// webhooks.max_response_bytes of the answer.
func (d *Dispatcher) send(ctx context.Context, del store.WebhookDelivery, key []byte, at time.Time) result {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, del.URL, bytes.NewReader(del.Payload))
	if err != nil {
		return result{err: "the URL cannot be requested"}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	telemetry.Inject(ctx, req.Header) // the attempt's span, when traced
	SetHeaders(req.Header, key, del.EventID, at, del.Payload)
	resp, err := d.client.Do(req)
	if err != nil {
		return result{err: describe(err, d.cfg.Timeout)}
	}
	defer resp.Body.Close()
	var head bytes.Buffer
	body := io.LimitReader(resp.Body, d.cfg.MaxResponseBytes)
	_, _ = io.CopyN(&head, body, snippetBytes)
	// Read the rest (within the cap) so the connection can be reused.
	_, _ = io.Copy(io.Discard, body)
	res := result{status: resp.StatusCode}
	switch {
	case res.ok():
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		res.err = fmt.Sprintf("HTTP %d: redirects are not followed", resp.StatusCode)
	default:
		res.err = fmt.Sprintf("HTTP %d", resp.StatusCode)
		if s := sanitize(head.String()); s != "" {
			res.err += ": " + s
		}
	}
	return res
}

// describe is the last_error of a request that got no answer. It drops
// the *url.Error wrapper, whose text repeats the URL (which may carry a
// token in its query).
func describe(err error, timeout time.Duration) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		if ue.Timeout() {
			return fmt.Sprintf("no answer within %s", timeout)
		}
		err = ue.Err
	}
	return sanitize(err.Error())
}

// sanitize keeps printable ASCII of s, spaces for the rest, at most 256
// bytes: text from the network goes into logs and the job document.
func sanitize(s string) string {
	var b strings.Builder
	space := false
	for _, r := range s {
		if r < 0x21 || r > 0x7e {
			space = true
			continue
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		b.WriteRune(r)
		if b.Len() >= 256 {
			break
		}
	}
	return b.String()
}

// hostOf is the host of a delivery URL, for logs: the path and query may
// carry a receiver's token.
func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Host
}
