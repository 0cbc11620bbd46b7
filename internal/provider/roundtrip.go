package provider

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/telemetry"
)

// The client calls its http.RoundTripper itself rather than through an
// http.Client: the client copied every request's header for its redirect
// handling (Header.Clone, 3.4% of a consumer's CPU in the side-by-side
// harness), and a provider's redirect is better an error than a job sent
// again elsewhere. What http.Client did that a call still needs is here:
// the basic auth of a base URL's user:password@, errors that name the
// request (without the password), an empty body for a transport that
// gives none, and the error for an https URL answered in plain HTTP.

// basicAuth is what a base URL's userinfo gives: the Authorization token
// http.Client would send for it, and its password, kept out of messages.
type basicAuth struct{ token, password string }

// withoutUserinfo returns base without user:password@, and the basic auth
// it held (nil when none).
func withoutUserinfo(base string) (string, *basicAuth, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, errors.New("provider: base URL does not parse")
	}
	if u.User == nil {
		return base, nil, nil
	}
	password, _ := u.User.Password()
	b := &basicAuth{token: base64.StdEncoding.EncodeToString([]byte(u.User.Username() + ":" + password)), password: password}
	u.User = nil
	return u.String(), b, nil
}

// builtinHeaders are the fixed header's own entries, which a call's extra
// headers do not replace.
var builtinHeaders = map[string]bool{"Content-Type": true, "Accept": true, "Authorization": true, "X-Dashscope-Wait-Timeout": true}

// headerFor is a request's header: the client's fixed header itself,
// which a transport only reads (http.RoundTripper), or a copy when the
// call adds headers or its trace (the W3C traceparent of a traced job).
func (c *Client) headerFor(ctx context.Context, extra http.Header) http.Header {
	if len(extra) == 0 && !telemetry.Traced(ctx) {
		return c.fixed
	}
	h := c.fixed.Clone()
	for name, vs := range extra {
		if !builtinHeaders[name] {
			h[name] = vs
		}
	}
	telemetry.Inject(ctx, h)
	return h
}

// roundTrip sends req through the client's transport.
func (c *Client) roundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err == nil && resp == nil {
		err = errors.New("the transport returned neither a response nor an error")
	}
	if err != nil {
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		var tlsErr tls.RecordHeaderError
		if errors.As(err, &tlsErr) && string(tlsErr.RecordHeader[:]) == "HTTP/" {
			err = http.ErrSchemeMismatch
		}
		op := req.Method[:1] + strings.ToLower(req.Method[1:])
		return nil, &url.Error{Op: op, URL: req.URL.Redacted(), Err: err}
	}
	if resp.Body == nil {
		resp.Body = http.NoBody
	}
	return resp, nil
}

// redirected is the classification of a 3xx answer: a client error that
// says where the provider points.
func redirected(resp *http.Response) ratecontrol.Classification {
	where := "with no Location"
	if loc := resp.Header.Get("Location"); loc != "" {
		where = "to " + loc
	}
	return ratecontrol.Classification{Kind: ratecontrol.KindClient, Status: resp.StatusCode,
		Message: fmt.Sprintf("the provider answered %d, redirecting %s; llmq follows no redirect: set the provider's base URL to where it points",
			resp.StatusCode, where)}
}
