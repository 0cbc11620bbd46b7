package webhook

import (
	"net/netip"
)

// nonPublic are the ranges a webhook may not reach unless
// webhooks.allow_private is set: what is inside the operator's network or
// the machine itself, and what is not a unicast destination at all.
var nonPublic = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8",       // "this network", incl. the unspecified address
		"10.0.0.0/8",      // RFC 1918
		"100.64.0.0/10",   // carrier-grade NAT
		"127.0.0.0/8",     // loopback
		"169.254.0.0/16",  // link-local, incl. cloud metadata 169.254.169.254
		"172.16.0.0/12",   // RFC 1918
		"192.0.0.0/24",    // IETF protocol assignments
		"192.0.2.0/24",    // documentation
		"192.168.0.0/16",  // RFC 1918
		"198.18.0.0/15",   // benchmarking
		"198.51.100.0/24", // documentation
		"203.0.113.0/24",  // documentation
		"224.0.0.0/4",     // multicast
		"240.0.0.0/4",     // reserved, incl. broadcast
		"::/96",           // unspecified, loopback, IPv4-compatible
		"100::/64",        // discard
		"2001:db8::/32",   // documentation
		"fc00::/7",        // unique local
		"fe80::/10",       // link-local
		"fec0::/10",       // site-local (deprecated)
		"ff00::/8",        // multicast
		"64:ff9b:1::/48",  // local-use NAT64
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// Embedding prefixes carry an IPv4 address that the network will reach:
// the address is judged by the IPv4 address inside.
var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4 = netip.MustParsePrefix("2002::/16")
)

// Public reports whether a webhook may reach addr when private addresses
// are not allowed: a unicast address outside loopback, private, link-local,
// carrier-grade NAT, documentation and reserved ranges, judged the same
// whether written as IPv4, IPv4-mapped IPv6 or an IPv6 prefix embedding
// IPv4 (NAT64, 6to4).
func Public(addr netip.Addr) bool {
	if !addr.IsValid() {
		return false
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is6() {
		b := addr.As16()
		switch {
		case nat64.Contains(addr):
			return Public(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
		case sixTo4.Contains(addr):
			return Public(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
		}
	}
	for _, p := range nonPublic {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}
