package store

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// A take of a group's parked jobs (LockParked, UnparkClaiming) reads
// jobs_parked_idx in created_at order and, read from the group's start,
// first walks the rows the last takes took: settled or claimed ones, whose
// index entries no scan may pass by unseen until no transaction is left
// that could still see their old version (open locks keep such
// transactions about), and locked ones, each passed only after a try of
// its row lock. Under a flood that is most of what a take reads (~800
// buffers for a batch of 128; BENCHMARKS.md, "Plans a stale statistic
// picks, and the parked jobs' graveyard"). So a store remembers where its last take of a group ended
// and starts the next one there: at the created_at of the newest row it
// took, not after it, as the rows of one insert share a created_at and the
// last take may have ended inside them. The intake's probe for parked rows
// of a group looks there first too (parkedProbe).
//
// Rows older than the cursor that are parked and free are taken all the
// same, only later: a take that finds nothing past the cursor reads the
// group from its start at once, one that finds fewer rows than it asked
// for drops the cursor (a read from the start sets one only when it got
// all it asked for), and a cursor is used for parkCursorFor after the
// read from the start that set it, then dropped. Rows this store hands
// back parked (a release, a settle that leaves rows parked, a park of
// existing rows) drop it at once, even while a read from the start is
// under way (drops); another replica's are found by the next read from
// the start, within parkCursorFor. So a group's rows are taken oldest
// first but for those another replica handed back, which may wait up to
// parkCursorFor past their turn.

// parkCursorFor bounds how long a store's takes of a group start past
// the group's start, and so how much later than its turn a parked row
// older than the cursor may be taken.
const parkCursorFor = time.Second

// parkCursors holds, per parked group, where the store's next take starts.
type parkCursors struct {
	mu    sync.Mutex
	m     map[ParkedGroup]parkCursor
	drops uint64 // counts drop and dropAll: a take under way when one ran sets no cursor
}

type parkCursor struct {
	from  time.Time // created_at of the newest row the last take took
	since time.Time // when a take last read the group from its start
}

func newParkCursors() *parkCursors { return &parkCursors{m: map[ParkedGroup]parkCursor{}} }

// start returns where the next take of g starts, or nil for the group's
// start.
func (p *parkCursors) start(g ParkedGroup, now time.Time) *time.Time {
	from, _ := p.begin(g, now)
	return from
}

// begin is start for a take, with the count of drops that took checks.
func (p *parkCursors) begin(g ParkedGroup, now time.Time) (*time.Time, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.m[g]
	if !ok {
		return nil, p.drops
	}
	if now.Sub(c.since) >= parkCursorFor {
		delete(p.m, g)
		return nil, p.drops
	}
	return &c.from, p.drops
}

// took records a take of g that started at start (nil: the group's start),
// asked for limit rows and took n, the newest created at newest.
func (p *parkCursors) took(g ParkedGroup, start *time.Time, drops uint64, limit, n int, newest, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case start == nil && n == limit && drops == p.drops:
		for k, c := range p.m { // forget groups no take has come back to
			if now.Sub(c.since) >= parkCursorFor {
				delete(p.m, k)
			}
		}
		p.m[g] = parkCursor{from: newest, since: now}
	case start == nil || n < limit:
		delete(p.m, g)
	default:
		c := p.m[g]
		if c.since.IsZero() {
			return // dropped meanwhile
		}
		if newest.After(c.from) {
			c.from = newest
			p.m[g] = c
		}
	}
}

// drop makes the next take of g read the group from its start.
func (p *parkCursors) drop(g ParkedGroup) {
	p.mu.Lock()
	p.drops++
	delete(p.m, g)
	p.mu.Unlock()
}

// dropAll is drop for every group: rows were parked again whose groups
// the caller does not know.
func (p *parkCursors) dropAll() {
	p.mu.Lock()
	p.drops++
	clear(p.m)
	p.mu.Unlock()
}

// lockParked runs lockParkedSQL in tx from the group's cursor (fromCursor).
func (s *Store) lockParked(ctx context.Context, tx pgx.Tx, g ParkedGroup, limit int) ([]Record, error) {
	return s.fromCursor(g, limit, func(start *time.Time) ([]Record, error) {
		rows, err := tx.Query(ctx, lockParkedSQL, g.Tenant, g.Model, string(g.Lane), limit, start)
		if err != nil {
			return nil, err
		}
		return collectRecords(rows)
	})
}

// fromCursor runs take, a statement that takes up to limit parked rows of
// g from start on (nil: the group's start), from the group's cursor, and
// again from the group's start when nothing past the cursor was free; it
// moves the cursor to the newest row taken.
func (s *Store) fromCursor(g ParkedGroup, limit int, take func(start *time.Time) ([]Record, error)) ([]Record, error) {
	start, drops := s.cursors.begin(g, time.Now())
	for {
		recs, err := take(start)
		if err != nil {
			return nil, err
		}
		var newest time.Time
		for _, r := range recs {
			if r.CreatedAt.After(newest) {
				newest = r.CreatedAt
			}
		}
		s.cursors.took(g, start, drops, limit, len(recs), newest, time.Now())
		if len(recs) > 0 || start == nil {
			return recs, nil
		}
		start = nil
	}
}

// parkedProbe is the intake's look for parked rows of each group g of a
// batch (columns tenant, model, priority, probe_from) in insertBatchSQL
// and absentSQL, one row when the group has any. Read from the group's
// start it walks the same rows a lock does (and, when the group has no
// parked row left, all of them), so it looks past the store's cursor for
// the group first (probe_from, NULL when there is none), and only when
// nothing is parked there from the start: the answer is the same, cheaper
// while the group's flood is being unparked.
const parkedProbe = `CROSS JOIN LATERAL (
		(SELECT FROM jobs j
			WHERE j.parked_at IS NOT NULL AND j.tenant = g.tenant AND j.model = g.model AND j.priority = g.priority
				AND j.created_at >= g.probe_from
			LIMIT 1)
		UNION ALL
		(SELECT FROM jobs j
			WHERE j.parked_at IS NOT NULL AND j.tenant = g.tenant AND j.model = g.model AND j.priority = g.priority
			LIMIT 1)
		LIMIT 1) probe`

// probeStarts returns, per row of a batch, its group's cursor for
// parkedProbe (nil where there is none), read once per group: the probe
// takes the distinct (group, cursor) pairs, and two cursors of one group
// would probe it twice and join its rows twice.
func (s *Store) probeStarts(tenants, models, lanes []string) []*time.Time {
	out := make([]*time.Time, len(tenants))
	now := time.Now()
	seen := make(map[ParkedGroup]*time.Time, 1)
	for i := range tenants {
		g := ParkedGroup{Tenant: tenants[i], Model: models[i], Lane: job.Priority(lanes[i])}
		from, ok := seen[g]
		if !ok {
			from = s.cursors.start(g, now)
			seen[g] = from
		}
		out[i] = from
	}
	return out
}
