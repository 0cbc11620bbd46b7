package webhook_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/llmq/llmq/internal/webhook"
)

func TestPublic(t *testing.T) {
	for _, s := range []string{
		"127.0.0.1", "127.9.9.9", "10.0.0.1", "172.16.5.4", "172.31.255.255", "192.168.1.1",
		"169.254.169.254", "169.254.0.1", "100.64.0.1", "100.127.255.254", "0.0.0.0", "0.1.2.3",
		"224.0.0.1", "255.255.255.255", "240.0.0.1", "192.0.2.10", "198.18.0.1",
		"::", "::1", "fc00::1", "fd12:3456::1", "fe80::1", "fe80::1%eth0", "ff02::1", "fec0::1",
		"::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.0.0.1", "::127.0.0.1",
		"64:ff9b::a9fe:a9fe", // NAT64 of 169.254.169.254
		"2002:7f00:1::",      // 6to4 of 127.0.0.1
		"2001:db8::1",
	} {
		assert.False(t, webhook.Public(netip.MustParseAddr(s)), "%s must not be public", s)
	}
	for _, s := range []string{
		"93.184.215.14", "8.8.8.8", "1.1.1.1", "172.32.0.1", "100.128.0.1", "169.255.0.1",
		"2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::",
	} {
		assert.True(t, webhook.Public(netip.MustParseAddr(s)), "%s is public", s)
	}
	assert.False(t, webhook.Public(netip.Addr{}), "the zero address")
}
