package store

import (
	"context"
	"hash/maphash"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A lock query of parked jobs (LockParked, or the CTE of Unpark and
// UnparkClaiming) that meets a row another transaction changed after the
// query's snapshot locks the row's newest version before it re-checks it,
// and keeps that lock when the row no longer qualifies and is dropped:
// Postgres releases no row lock before the transaction ends. Had a settle
// committed its claims while a LockParked of the same group was under way,
// the claimed rows stayed locked by that second, still open lock, and their
// completions waited for it (up to worker.store_delay; a tenth of a flood's
// Postgres samples were such waits). So within one store a lock query of a
// group and a commit that takes parked rows of that group never overlap:
// the query then sees the rows either still locked (and skips them) or
// already taken (and passes them by). Between replicas the race remains, as
// rare as two replicas unparking the same group at the same moment; it
// costs a wait, never a wrong write.

// parkedGates holds one mutex per stripe of parked groups.
type parkedGates struct {
	seed    maphash.Seed
	stripes [16]sync.Mutex
}

func newParkedGates() *parkedGates { return &parkedGates{seed: maphash.MakeSeed()} }

// of is the gate of g's stripe.
func (p *parkedGates) of(g ParkedGroup) *sync.Mutex {
	return &p.stripes[maphash.Comparable(p.seed, g)%uint64(len(p.stripes))]
}

// gated runs an autocommit statement that takes parked rows of g on a
// connection of its own, inside g's gate; the connection is
// taken before the gate, so that a call waiting for one does not hold up
// the settles that would give one back.
func (s *Store) gated(ctx context.Context, g ParkedGroup, run func(*pgxpool.Conn) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	gate := s.gates.of(g)
	gate.Lock()
	defer gate.Unlock()
	return run(conn)
}
