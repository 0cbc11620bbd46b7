package worker

import "github.com/llmq/llmq/internal/job"

// fairQueue orders one model's waiting jobs: smooth weighted round robin
// over the lanes (nginx's SWRR: every pick adds each non-empty lane's weight
// to its credit, takes the lane with the most credit and charges it the
// total), and the same over the tenants inside a lane, by tenant weight
// (tenants.weight, default equal). SWRR is its own starvation guard: a
// non-empty low lane with weight 1 of 10 is picked at least once in every 10
// picks however busy the other lanes are, and a tenant of weight w among
// tenants of total weight W gets w of every W picks while it has jobs,
// however many jobs the others have. A tenant over its own limits
// (tenantlimit.go) is passed over until it is eligible again. Not safe for
// concurrent use.
type fairQueue struct {
	lanes  [3]laneQueue
	n      int
	weight func(tenant string) float64
}

type laneQueue struct {
	weight  int
	credit  int
	tenants map[string]*fifo
	ring    []string // tenants with waiting jobs, in arrival order
	credits map[string]float64
	n       int
}

type fifo struct {
	items []*task
	head  int
}

func (f *fifo) push(t *task) { f.items = append(f.items, t) }
func (f *fifo) len() int     { return len(f.items) - f.head }
func (f *fifo) pop() *task {
	t := f.items[f.head]
	f.items[f.head] = nil
	f.head++
	if f.head > 32 && f.head*2 > len(f.items) {
		f.items = append(f.items[:0:0], f.items[f.head:]...)
		f.head = 0
	}
	return t
}

func laneIndex(p job.Priority) int {
	switch p {
	case job.PriorityHigh:
		return 0
	case job.PriorityLow:
		return 2
	}
	return 1
}

func newFairQueue(high, normal, low int) *fairQueue {
	q := &fairQueue{weight: func(string) float64 { return 1 }}
	for i, w := range []int{high, normal, low} {
		if w < 1 {
			w = 1
		}
		q.lanes[i] = laneQueue{weight: w, tenants: map[string]*fifo{}, credits: map[string]float64{}}
	}
	return q
}

func (q *fairQueue) Len() int { return q.n }

// LaneLen is the number of waiting jobs of a lane.
func (q *fairQueue) LaneLen(p job.Priority) int { return q.lanes[laneIndex(p)].n }

func (q *fairQueue) Push(t *task) {
	l := &q.lanes[laneIndex(t.job.Priority)]
	f := l.tenants[t.job.Tenant]
	if f == nil {
		f = &fifo{}
		l.tenants[t.job.Tenant] = f
	}
	if f.len() == 0 {
		l.ring = append(l.ring, t.job.Tenant)
	}
	f.push(t)
	l.n++
	q.n++
}

// Pop returns the next job in fair order, or nil when empty.
func (q *fairQueue) Pop() *task { return q.PopEligible(nil) }

// PopEligible returns the next job in fair order among the tenants eligible
// says may go now (nil: every tenant), or nil when there is none.
func (q *fairQueue) PopEligible(eligible func(tenant string) bool) *task {
	if q.n == 0 {
		return nil
	}
	total, best := 0, -1
	for i := range q.lanes {
		l := &q.lanes[i]
		if l.n == 0 || !l.hasEligible(eligible) {
			continue
		}
		l.credit += l.weight
		total += l.weight
		if best < 0 || l.credit > q.lanes[best].credit {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	l := &q.lanes[best]
	l.credit -= total
	t := l.pop(q.weight, eligible)
	q.n--
	if l.n == 0 {
		l.credit = 0
	}
	return t
}

func (l *laneQueue) hasEligible(eligible func(string) bool) bool {
	if eligible == nil {
		return true
	}
	for _, tenant := range l.ring {
		if eligible(tenant) {
			return true
		}
	}
	return false
}

// pop takes the next job of the lane's eligible tenants by SWRR over their
// weights; ties go to the tenant that has waited longest in the ring.
func (l *laneQueue) pop(weight func(string) float64, eligible func(string) bool) *task {
	var total float64
	best := -1
	for i, tenant := range l.ring {
		if eligible != nil && !eligible(tenant) {
			continue
		}
		w := weight(tenant)
		l.credits[tenant] += w
		total += w
		if best < 0 || l.credits[tenant] > l.credits[l.ring[best]] {
			best = i
		}
	}
	tenant := l.ring[best]
	l.credits[tenant] -= total
	f := l.tenants[tenant]
	t := f.pop()
	if f.len() == 0 {
		delete(l.tenants, tenant)
		delete(l.credits, tenant)
		l.ring = append(l.ring[:best], l.ring[best+1:]...)
	}
	l.n--
	return t
}

// TakeNewest removes and returns up to n of the tenant's newest waiting
// jobs of lane.
func (q *fairQueue) TakeNewest(tenant string, lane job.Priority, n int) []*task {
	l := &q.lanes[laneIndex(lane)]
	f := l.tenants[tenant]
	var out []*task
	for f != nil && f.len() > 0 && len(out) < n {
		last := len(f.items) - 1
		out = append(out, f.items[last])
		f.items[last] = nil
		f.items = f.items[:last]
		l.n--
		q.n--
	}
	if f != nil && f.len() == 0 {
		delete(l.tenants, tenant)
		delete(l.credits, tenant)
		for i, name := range l.ring {
			if name == tenant {
				l.ring = append(l.ring[:i], l.ring[i+1:]...)
				break
			}
		}
	}
	if l.n == 0 {
		l.credit = 0
	}
	return out
}

// Drain removes and returns every waiting job.
func (q *fairQueue) Drain() []*task {
	var out []*task
	for t := q.Pop(); t != nil; t = q.Pop() {
		out = append(out, t)
	}
	return out
}
