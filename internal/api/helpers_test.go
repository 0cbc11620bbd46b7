package api_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// newTestServer serves srv for the test, recording its answers for the
// OpenAPI check (contract).
func newTestServer(t *testing.T, srv *api.Server) *httptest.Server {
	ts := httptest.NewServer(contract.record(srv))
	t.Cleanup(ts.Close)
	return ts
}

// closedPoolStore is a store whose pool is closed: every query fails.
func closedPoolStore(t *testing.T) *store.Store {
	cfg, err := pgxpool.ParseConfig(testsvc.PostgresURL(t))
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	pool.Close()
	return store.New(pool)
}
