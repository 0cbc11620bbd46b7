package worker

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseFailpoint(t *testing.T) {
	fp, err := ParseFailpoint("", nil)
	require.NoError(t, err)
	require.Nil(t, fp, "no spec, no hook")

	for _, bad := range []string{"nowhere", "after_provider_call:0", "after_result_write:x"} {
		_, err := ParseFailpoint(bad, nil)
		require.Error(t, err, bad)
	}

	var fired []string
	fp, err = ParseFailpoint("after_result_write:3", func(name string) { fired = append(fired, name) })
	require.NoError(t, err)
	for range 5 {
		fp(FailpointAfterProviderCall)
		fp(FailpointAfterResultWrite)
	}
	require.Equal(t, []string{FailpointAfterResultWrite}, fired, "fires once, on the third pass of its own point")
}
