package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRetentionDefaultsAndOverrides(t *testing.T) {
	c, err := Parse([]byte(`
retention:
  succeeded: 48h
  batch: 500
tenants:
  gold:
    retention:
      succeeded: 2160h
`), nil)
	require.NoError(t, err)
	r := c.Retention
	require.Equal(t, 48*time.Hour, r.Succeeded)
	require.Equal(t, 30*24*time.Hour, r.Failed)
	require.Equal(t, 30*24*time.Hour, r.Dead)
	require.Equal(t, 7*24*time.Hour, r.Cancelled)
	require.Equal(t, 7*24*time.Hour, r.Idempotency)
	require.Equal(t, 400*24*time.Hour, r.Usage)
	require.Equal(t, time.Minute, r.Interval)
	require.Equal(t, 500, r.Batch)
	require.Equal(t, 2160*time.Hour, c.Tenants["gold"].Retention.Succeeded)
}

func TestRetentionValidation(t *testing.T) {
	for yaml, key := range map[string]string{
		"retention: {failed: -1h}":                       "retention.failed",
		"retention: {batch: -5}":                         "retention.batch",
		"tenants: {gold: {retention: {cancelled: -1s}}}": "tenants.gold.retention.cancelled",
	} {
		_, err := Parse([]byte(yaml), nil)
		require.ErrorContains(t, err, key, yaml)
	}
}
