package testsvc

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SmallStackDepth is the nesting at which PostgresSmallStack's sessions
// refuse a JSON value; DeepJSON(SmallStackDepth) passes llmq's checks,
// which follow encoding/json's limit of 10,000.
const SmallStackDepth = 2000

// PostgresSmallStack is Postgres on a fresh migrated database (as
// Postgres) whose sessions run with max_stack_depth at 100kB, the server's
// least: jsonb then refuses a value nested SmallStackDepth deep with
// "stack depth limit exceeded" (SQLSTATE 54001). No input known to pass
// llmq's validation is refused by a server as configured by default, so
// this is how a test reaches a value Postgres refuses past validation, the
// case a deployment with a smaller stack (or a future Postgres rule) hits.
// Setting the parameter takes a superuser, as the test servers have.
func PostgresSmallStack(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return pgConnect(t, PostgresURL(t), SmallStack)
}

// SmallStack sets a pool's sessions' max_stack_depth to 100kB, as
// PostgresSmallStack's are.
func SmallStack(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["max_stack_depth"] = "100kB" }

// DeepJSON is a JSON array nested depth deep: [[…]].
func DeepJSON(depth int) string {
	return strings.Repeat("[", depth) + strings.Repeat("]", depth)
}
