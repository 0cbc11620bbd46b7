package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// ErrNonPublic reports a connection refused because the address dialled
// is not public (see Public) and private addresses are not allowed.
var ErrNonPublic = errors.New("address is not public")

// ClientConfig shapes the HTTP client that sends webhooks.
type ClientConfig struct {
	// AllowPrivate lets the client reach non-public addresses.
	AllowPrivate bool
	// Timeout bounds one attempt: connect, request, and reading the
	// answer (default 10s).
	Timeout time.Duration
	// LookupIP, when set, resolves host names in place of the system
	// resolver; tests point a name at an address with it. The addresses
	// it returns are checked like any other.
	LookupIP func(ctx context.Context, host string) ([]netip.Addr, error)
}

// NewClient returns the client webhooks are sent with. It refuses, at the
// moment of connecting, any address that is not public unless
// AllowPrivate: the check is on the address actually dialled, after name
// resolution, so a name that resolves to a public address at submit and to
// 127.0.0.1 at delivery (DNS rebinding) is still refused. It uses no proxy
// from the environment (a proxy would dial for it, unchecked), follows no
// redirect (a 3xx is returned as the answer, which a sender counts as a
// failure), and bounds each request by Timeout.
func NewClient(cfg ClientConfig) *http.Client {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	dialer := &net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}
	if !cfg.AllowPrivate {
		dialer.Control = refuseNonPublic
	}
	dial := dialer.DialContext
	if cfg.LookupIP != nil {
		dial = func(ctx context.Context, network, address string) (net.Conn, error) {
			return dialResolved(ctx, dialer, cfg.LookupIP, network, address)
		}
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         dial,
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: cfg.Timeout,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		// What a receiver answers is only read to be capped and dropped.
		DisableCompression: true,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   cfg.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// refuseNonPublic is the dialer's Control: it runs for every address the
// dialer tries, after resolution, before the connection is made.
func refuseNonPublic(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("webhook: dial %s %q: %w", network, address, ErrNonPublic)
	}
	if !Public(ap.Addr()) {
		return fmt.Errorf("webhook: refused to connect to %s: %w", ap.Addr().Unmap(), ErrNonPublic)
	}
	return nil
}

// dialResolved resolves address's host with lookup and dials the
// addresses in turn; the dialer's Control still judges each one.
func dialResolved(ctx context.Context, d *net.Dialer, lookup func(context.Context, string) ([]netip.Addr, error),
	network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if addrs, err = lookup(ctx, host); err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve %s: no addresses", host)
	}
	var first error
	for _, a := range addrs {
		c, err := d.DialContext(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
	}
	return nil, first
}
