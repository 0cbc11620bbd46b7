package kafka

import (
	"sync"
	"testing"
)

// Deliveries of one partition finish on several goroutines, each reading
// its commit point from the tracker and then storing it: a lower point
// stored after a higher one (perhaps already committed) used to move the
// commit back, so the next reader got settled messages again. This drives
// four finishers over 2,000 offsets while a monitor takes what commit()
// would send, and checks that what it takes never goes back.
func TestCommitPointNeverGoesBack(t *testing.T) {
	for round := range 50 {
		g := &groupConsumer{trackers: map[int]*offsetTracker{}, toCommit: map[int]commitPoint{},
			queued: map[*offsetTracker]int64{}, wake: make(chan struct{}, 1)}
		tr := newOffsetTracker()
		g.trackers[0] = tr
		const n = 2000
		for o := int64(0); o < n; o++ {
			tr.fetched(o)
		}
		var sent []int64
		take := func() {
			g.mu.Lock()
			if cp, ok := g.toCommit[0]; ok {
				sent = append(sent, cp.next)
				clear(g.toCommit)
			}
			g.mu.Unlock()
		}
		stop := make(chan struct{})
		var mon sync.WaitGroup
		mon.Go(func() {
			for {
				take()
				select {
				case <-stop:
					return
				default:
				}
			}
		})
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for o := int64(w); o < n; o += 4 {
					g.finish(tr, 0, o)
				}
			})
		}
		wg.Wait()
		close(stop)
		mon.Wait()
		take()
		for i := 1; i < len(sent); i++ {
			if sent[i] <= sent[i-1] {
				t.Fatalf("round %d: commit point %d sent after %d", round, sent[i], sent[i-1])
			}
		}
		if len(sent) == 0 || sent[len(sent)-1] != n {
			t.Fatalf("round %d: the last commit point is not %d: %v", round, n, sent[max(0, len(sent)-3):])
		}
	}
}
