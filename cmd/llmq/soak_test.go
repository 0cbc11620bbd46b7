package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSoakRefusesToRestartUnnamedServers: the soak restarts the servers
// it is pointed at, so it runs only when told how (or told not to).
func TestSoakRefusesToRestartUnnamedServers(t *testing.T) {
	noEnv := func(string) (string, bool) { return "", false }
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"soak", "--restart-postgres-cmd", "true"}, noEnv, &out, &errOut)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--restart-rabbitmq-cmd")
	err = run(context.Background(), []string{"soak", "--no-restarts", "--consumers", "0"}, noEnv, &out, &errOut)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--consumers")
}
