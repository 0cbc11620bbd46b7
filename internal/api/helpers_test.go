package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

func newTestServer(t *testing.T, h http.Handler) *httptest.Server {
	ts := httptest.NewServer(h)
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
