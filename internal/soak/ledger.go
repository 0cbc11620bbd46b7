package soak

import (
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Ledger is the soak's account of every job, kept from three witnesses
// that share no code with the pipeline: the submitter (what was accepted
// and when), llmsim (every provider call per job id and its status) and
// the results exchange (every terminal event per job id). Postgres adds the
// final status at the end. Safe for concurrent use.
type Ledger struct {
	mu   sync.Mutex
	jobs map[string]*jobRecord
}

// jobRecord is one job id as the witnesses saw it.
type jobRecord struct {
	via         string            // "http" or "amqp"
	accepted    bool              // a 202 or a publisher confirm
	acceptedAt  time.Time         // when the acknowledgement arrived
	firstCall   time.Time         // the first provider call that reached llmsim
	calls       int               // provider calls that reached llmsim
	paid        int               // calls llmsim answered 200 (billed)
	rateLimited int               // calls llmsim answered 429
	events      map[string]string // event_id → event type (job.succeeded, …)
	deliveries  int               // result-event deliveries, redeliveries included
	final       string            // status in Postgres at the end; "" = no row
	finalSeen   bool
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger { return &Ledger{jobs: map[string]*jobRecord{}} }

func (l *Ledger) rec(id string) *jobRecord {
	r := l.jobs[id]
	if r == nil {
		r = &jobRecord{}
		l.jobs[id] = r
	}
	return r
}

// Accept records that the submission of id over via was acknowledged at.
func (l *Ledger) Accept(id, via string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rec(id)
	r.via, r.accepted = via, true
	if r.acceptedAt.IsZero() {
		r.acceptedAt = at
	}
}

// Call records a provider call for id that llmsim answered with status.
func (l *Ledger) Call(id string, status int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rec(id)
	r.calls++
	if r.firstCall.IsZero() || at.Before(r.firstCall) {
		r.firstCall = at
	}
	switch {
	case status == 200:
		r.paid++
	case status == 429:
		r.rateLimited++
	}
}

// Event records one delivery of a result event for id.
func (l *Ledger) Event(id, eventID, typ string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rec(id)
	if r.events == nil {
		r.events = map[string]string{}
	}
	r.events[eventID] = typ
	r.deliveries++
}

// Final records id's status in Postgres at the end of the run.
func (l *Ledger) Final(id, status string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rec(id)
	r.final, r.finalSeen = status, true
}

// Accepted returns the ids accepted so far.
func (l *Ledger) Accepted() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []string
	for id, r := range l.jobs {
		if r.accepted {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// Settled reports whether every accepted job is terminal in Postgres (as
// far as Final said) and has at least one result event.
func (l *Ledger) Settled() (settled bool, open int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.jobs {
		if r.accepted && (!terminal(r.final) || len(r.events) == 0) {
			open++
		}
	}
	return open == 0, open
}

func terminal(status string) bool {
	switch status {
	case "succeeded", "failed", "dead", "cancelled":
		return true
	}
	return false
}

// Problem is one job that was lost or duplicated, with what the witnesses saw.
type Problem struct {
	ID     string
	Via    string
	Reason string
}

// Summary is the soak's verdict on the jobs.
type Summary struct {
	Accepted     int
	AcceptedVia  map[string]int
	Succeeded    int
	OtherFinal   map[string]int // accepted jobs that ended failed, dead or cancelled
	Lost         []Problem      // accepted, and not terminal in Postgres or no result event
	Duplicated   []Problem      // more than one distinct terminal event: finished (stored and answered) twice
	Repaid       int            // jobs llmsim answered 200 more than once (stored once)
	Redelivered  int            // result events delivered again with the same event_id (readers dedupe)
	Strays       int            // calls or events for ids never accepted
	Requests     int            // provider calls that reached llmsim
	RateLimited  int            // of them answered 429
	QueueP50     time.Duration  // acknowledgement → first provider call
	QueueP99     time.Duration
	QueueMax     time.Duration
	NeverCalled  int // accepted jobs with no provider call (e.g. failed at intake)
	RateLimitPct float64
}

// Summarize computes the verdict. Call it after Final for every job.
func (l *Ledger) Summarize() Summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Summary{AcceptedVia: map[string]int{}, OtherFinal: map[string]int{}}
	var waits []time.Duration
	ids := make([]string, 0, len(l.jobs))
	for id := range l.jobs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r := l.jobs[id]
		s.Requests += r.calls
		s.RateLimited += r.rateLimited
		if !r.accepted {
			s.Strays++
			continue
		}
		s.Accepted++
		s.AcceptedVia[r.via]++
		if r.paid > 1 {
			s.Repaid++
		}
		s.Redelivered += r.deliveries - len(r.events)
		if r.firstCall.IsZero() {
			s.NeverCalled++
		} else {
			waits = append(waits, max(r.firstCall.Sub(r.acceptedAt), 0))
		}
		switch {
		case !r.finalSeen || r.final == "":
			s.Lost = append(s.Lost, Problem{id, r.via, "no row in Postgres"})
			continue
		case !terminal(r.final):
			s.Lost = append(s.Lost, Problem{id, r.via, "still " + r.final + " in Postgres after the drain"})
			continue
		case len(r.events) == 0:
			s.Lost = append(s.Lost, Problem{id, r.via, r.final + " in Postgres but no result event reached llmq.results"})
			continue
		}
		if len(r.events) > 1 {
			s.Duplicated = append(s.Duplicated, Problem{id, r.via, describeEvents(r)})
		}
		if r.final == "succeeded" {
			s.Succeeded++
		} else {
			s.OtherFinal[r.final]++
		}
	}
	s.QueueP50, s.QueueP99, s.QueueMax = quantile(waits, 0.50), quantile(waits, 0.99), quantile(waits, 1)
	if s.Requests > 0 {
		s.RateLimitPct = 100 * float64(s.RateLimited) / float64(s.Requests)
	}
	return s
}

func describeEvents(r *jobRecord) string {
	var types []string
	for _, t := range r.events {
		types = append(types, t)
	}
	slices.Sort(types)
	return "distinct terminal events " + strings.Join(types, ", ") + "; provider answered 200 " + strconv.Itoa(r.paid) + " times"
}

// quantile is the nearest-rank q-quantile of d (0 for none).
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
