// Package leakcheck is the goroutine-leak check of llmq's tests. Every
// package whose code or tests start goroutines runs its tests through Main:
//
//	func TestMain(m *testing.M) { leakcheck.Main(m) }
//
// so a goroutine that outlives the tests, one its owner never stopped,
// fails the run (go.uber.org/goleak).
package leakcheck

import "go.uber.org/goleak"

// Option tolerates goroutines that Main would otherwise report, for
// example goleak.IgnoreTopFunction("pkg.(*T).loop").
type Option = goleak.Option

// M is what Main runs: a *testing.M, or a wrapper whose Run checks more
// once the tests have run and returns the exit code of the whole.
type M interface{ Run() int }

// Main runs m's tests and, when they pass, fails the run if goroutines
// other than those opts tolerate are still running.
func Main(m M, opts ...Option) { goleak.VerifyTestMain(m, opts...) }

// LateCleanup tolerates the goroutines tests' cleanups stop after the last
// test has returned: the health check of a pgx pool closed in t.Cleanup,
// and readers of closed keep-alive connections still unwinding.
func LateCleanup() []Option {
	return []Option{
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	}
}
