package kafka

import "sync"

// offsetTracker follows the in-flight offsets of one partition (in fetch
// order, which is offset order) and says how far it is safe to commit: up
// to, not including, the lowest unfinished offset.
type offsetTracker struct {
	mu        sync.Mutex
	inflight  []int64        // fetched offsets not yet popped, ascending
	done      map[int64]bool // finished offsets still behind an unfinished one
	committed int64          // next offset to commit (exclusive bound); -1 = none
	last      int64          // highest offset fetched
}

func newOffsetTracker() *offsetTracker {
	return &offsetTracker{done: make(map[int64]bool), committed: -1, last: -1}
}

// fetched records a new in-flight offset. It reports false when offset does
// not follow the last one (the partition was rewound by a rebalance): the
// caller then starts a fresh tracker.
func (t *offsetTracker) fetched(offset int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if offset <= t.last {
		return false
	}
	t.last = offset
	t.inflight = append(t.inflight, offset)
	return true
}

// finish marks offset done and returns the new commit point (the offset to
// commit as "next to read") and whether it advanced.
func (t *offsetTracker) finish(offset int64) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done[offset] = true
	advanced := false
	for len(t.inflight) > 0 && t.done[t.inflight[0]] {
		delete(t.done, t.inflight[0])
		t.committed = t.inflight[0] + 1
		t.inflight = t.inflight[1:]
		advanced = true
	}
	return t.committed, advanced
}
