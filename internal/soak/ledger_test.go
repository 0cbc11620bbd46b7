package soak

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSummarizeCountsEachWitness(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 16, 0, 0, 0, time.UTC)
	l := NewLedger()
	// ok: accepted, called once, one event, succeeded.
	l.Accept("ok", "http", t0)
	l.Call("ok", 200, t0.Add(100*time.Millisecond))
	l.Event("ok", "e1", "job.succeeded")
	l.Final("ok", "succeeded")
	// repaid: a consumer was killed after the call; the retry paid again,
	// one result stored, its event delivered twice with one event_id.
	l.Accept("repaid", "amqp", t0)
	l.Call("repaid", 429, t0.Add(time.Second))
	l.Call("repaid", 200, t0.Add(2*time.Second))
	l.Call("repaid", 200, t0.Add(40*time.Second))
	l.Event("repaid", "e2", "job.succeeded")
	l.Event("repaid", "e2", "job.succeeded")
	l.Final("repaid", "succeeded")
	// twice: two distinct terminal events, the job finished twice.
	l.Accept("twice", "http", t0)
	l.Call("twice", 200, t0.Add(3*time.Second))
	l.Call("twice", 200, t0.Add(4*time.Second))
	l.Event("twice", "e3", "job.succeeded")
	l.Event("twice", "e4", "job.succeeded")
	l.Final("twice", "succeeded")
	// lost three ways.
	l.Accept("norow", "amqp", t0)
	l.Accept("stuck", "amqp", t0)
	l.Final("stuck", "running")
	l.Accept("noevent", "http", t0)
	l.Call("noevent", 200, t0.Add(5*time.Second))
	l.Final("noevent", "succeeded")
	// dead, with its event: terminal, not lost, not succeeded.
	l.Accept("dead", "http", t0)
	l.Event("dead", "e5", "job.dead")
	l.Final("dead", "dead")
	// never acknowledged: a stray, in no count but the calls.
	l.Call("stray", 200, t0)
	l.Final("stray", "succeeded")

	s := l.Summarize()
	assert.Equal(t, 7, s.Accepted)
	assert.Equal(t, map[string]int{"http": 4, "amqp": 3}, s.AcceptedVia)
	assert.Equal(t, 3, s.Succeeded) // ok, repaid, twice
	assert.Equal(t, map[string]int{"dead": 1}, s.OtherFinal)
	require.Len(t, s.Lost, 3)
	assert.Equal(t, []Problem{
		{"noevent", "http", "succeeded in Postgres but no result event reached llmq.results"},
		{"norow", "amqp", "no row in Postgres"},
		{"stuck", "amqp", "still running in Postgres after the drain"},
	}, s.Lost)
	require.Len(t, s.Duplicated, 1)
	assert.Equal(t, "twice", s.Duplicated[0].ID)
	assert.Contains(t, s.Duplicated[0].Reason, "answered 200 2 times")
	assert.Equal(t, 2, s.Repaid) // repaid and twice
	assert.Equal(t, 1, s.Redelivered)
	assert.Equal(t, 1, s.Strays)
	assert.Equal(t, 8, s.Requests) // the stray's call included
	assert.Equal(t, 1, s.RateLimited)
	assert.InDelta(t, 100.0/8, s.RateLimitPct, 1e-9)
	assert.Equal(t, 3, s.NeverCalled) // norow, stuck, dead
	// waits: 100ms, 1s, 3s, 5s: p50 the 2nd, p99 and max the 4th.
	assert.Equal(t, time.Second, s.QueueP50)
	assert.Equal(t, 5*time.Second, s.QueueP99)
	assert.Equal(t, 5*time.Second, s.QueueMax)
}

func TestSettledNeedsTerminalRowAndEvent(t *testing.T) {
	l := NewLedger()
	l.Accept("a", "http", time.Now())
	ok, open := l.Settled()
	assert.False(t, ok)
	assert.Equal(t, 1, open)
	l.Final("a", "succeeded")
	ok, _ = l.Settled()
	assert.False(t, ok, "a terminal row without its event is not settled")
	l.Event("a", "e", "job.succeeded")
	ok, open = l.Settled()
	assert.True(t, ok)
	assert.Zero(t, open)
	l.Call("b", 200, time.Now()) // never accepted: does not hold the drain
	ok, _ = l.Settled()
	assert.True(t, ok)
}

func TestQuantileNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 200; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	assert.Equal(t, 198*time.Millisecond, quantile(d, 0.99))
	assert.Equal(t, 100*time.Millisecond, quantile(d, 0.5))
	assert.Equal(t, 200*time.Millisecond, quantile(d, 1))
	assert.Zero(t, quantile(nil, 0.99))
}

func TestScheduleSpreadsFaults(t *testing.T) {
	f := Schedule(30*time.Minute, 5*time.Minute, Victims(3))
	var got []string
	for _, x := range f {
		got = append(got, x.At.String()+" "+x.Kind+" "+x.Target)
	}
	assert.Equal(t, []string{
		"5m0s kill consumer-2", "10m0s kill consumer-3", "12m30s restart-rabbitmq ",
		"15m0s kill consumer-2", "17m30s restart-postgres ", "20m0s kill consumer-3", "25m0s kill consumer-2",
	}, got)
	assert.Equal(t, []string{"consumer-1"}, Victims(1))
}

func TestParseStatus(t *testing.T) {
	m, err := parseStatus([]byte("Name:\tconsumer\nVmPeak:\t  900 kB\nVmRSS:\t   31544 kB\nRssAnon:\t   14496 kB\nRssFile:\t   17048 kB\nThreads:\t9\n"))
	require.NoError(t, err)
	assert.Equal(t, Memory{RSS: 31544, Anon: 14496}, m)
	_, err = parseStatus([]byte("Name:\tkthreadd\n"))
	assert.Error(t, err)
	_, err = parseStatus([]byte("VmRSS:\t12 MB\n"))
	assert.Error(t, err)
}

func TestIncarnationRSSStartsWhenWarm(t *testing.T) {
	t0 := time.Now()
	inc := Incarnation{Started: t0}
	inc.record(Memory{100, 10}, t0.Add(10*time.Second), time.Minute)
	assert.Zero(t, inc.Start, "not warm yet")
	inc.record(Memory{200, 20}, t0.Add(time.Minute), time.Minute)
	inc.record(Memory{210, 30}, t0.Add(2*time.Minute), time.Minute)
	inc.frozen = true
	inc.record(Memory{900, 90}, t0.Add(3*time.Minute), time.Minute)
	assert.Equal(t, Memory{200, 20}, inc.Start, "the samples in the minute after warm-up")
	assert.Equal(t, Memory{205, 25}, inc.Last, "the samples of the last minute, the 10s one dropped")
	g, ok := inc.Growth()
	require.True(t, ok)
	assert.InDelta(t, 0.025, g, 1e-9)
	g, ok = inc.AnonGrowth()
	require.True(t, ok)
	assert.InDelta(t, 0.25, g, 1e-9)
}

func TestVerdictAndTable(t *testing.T) {
	start := time.Now()
	r := &Report{Plan: Plan{Duration: time.Minute, Load: 0.7, RPM: 1200, Consumers: 2, Warmup: time.Second}, Started: start,
		Summary: Summary{AcceptedVia: map[string]int{}, OtherFinal: map[string]int{}}, NotAccepted: map[string]int{},
		Procs: []Incarnation{
			{Name: "producer", PID: 1, Started: start.Add(-time.Second), Start: Memory{RSS: 100}, Last: Memory{RSS: 109}},
			// killed: grew more, but a killed incarnation is no leak verdict
			{Name: "consumer-2", PID: 2, Started: start, Ended: start.Add(time.Minute), Start: Memory{RSS: 100}, Last: Memory{RSS: 150}},
			// the soak itself: its ledger grows with the jobs by design
			{Name: "llmq soak", PID: 3, Started: start.Add(-time.Second), Start: Memory{RSS: 100}, Last: Memory{RSS: 140}, Witness: true},
		}}
	ok, why := r.Verdict(0.10)
	assert.True(t, ok, why)
	r.Procs[0].Last.RSS = 111
	r.Summary.Lost = []Problem{{"x", "amqp", "no row in Postgres"}}
	ok, why = r.Verdict(0.10)
	assert.False(t, ok)
	assert.Equal(t, []string{"1 lost", "producer RSS grew 11.0%"}, why)
	var b bytes.Buffer
	r.Print(&b)
	assert.Contains(t, b.String(), "| **lost** | **1** |")
	assert.Contains(t, b.String(), "x (amqp): no row in Postgres")
	assert.True(t, strings.Contains(b.String(), "| producer | 1 |"))
}
