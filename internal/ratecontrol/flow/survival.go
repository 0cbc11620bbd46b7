package flow

import (
	"cmp"
	"slices"
	"time"
)

// SurvivalTable answers "what output does a call still unanswered after a
// seconds have, on average?" from the last settled calls: sorted by latency,
// the mean output of every call that took longer than a. Answers take time
// to generate, so a call that outlives the short answers is a long one, and
// auto can charge it as such seconds after it went out instead of when it
// settles (ratecontrol's aging). Where latency says nothing about output, the
// conditional mean stays the plain mean and nothing changes.
type SurvivalTable struct {
	lat []float64 // ascending
	out []Outlook // out[i] is of the calls lat[i:]
	// for calls older than any sample: the slowest tenth
	tail Outlook
}

// Outlook describes the output of the calls that took longer than
// some age: mean, variance and largest.
type Outlook struct{ Mean, Variance, Max float64 }

// OutputGivenAge describes the output of calls that took longer than age,
// and returns false while too few calls with a known latency have settled.
func (s SurvivalTable) OutputGivenAge(age time.Duration) (Outlook, bool) {
	if len(s.lat) == 0 {
		return Outlook{}, false
	}
	a := age.Seconds()
	i, _ := slices.BinarySearch(s.lat, a)
	for i < len(s.lat) && s.lat[i] <= a {
		i++
	}
	if i == len(s.lat) {
		return s.tail, true
	}
	return s.out[i], true
}

// Survival returns the survival table of the last settled calls, rebuilt
// when calls settled since the last build. Its slices are never changed
// after the build, so callers may read them without the lock.
func (c *Calibrator) Survival() SurvivalTable {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.survivalAt == c.outSamples {
		return c.survival
	}
	c.survivalAt = c.outSamples
	n := min(c.outSamples, outputWindow)
	type pair struct{ lat, out float64 }
	ps := make([]pair, 0, n)
	for i := range n {
		if c.latRing[i] > 0 {
			ps = append(ps, pair{c.latRing[i], c.outRing[i]})
		}
	}
	if len(ps) < coldSamples {
		c.survival = SurvivalTable{}
		return c.survival
	}
	slices.SortFunc(ps, func(a, b pair) int { return cmp.Compare(a.lat, b.lat) })
	t := SurvivalTable{lat: make([]float64, len(ps)), out: make([]Outlook, len(ps))}
	sum, sq, hi := 0.0, 0.0, 0.0
	for i := len(ps) - 1; i >= 0; i-- {
		x := ps[i].out
		sum += x
		sq += x * x
		hi = max(hi, x)
		n := float64(len(ps) - i)
		m := sum / n
		t.lat[i], t.out[i] = ps[i].lat, Outlook{Mean: m, Variance: max(sq/n-m*m, 0), Max: hi}
	}
	t.tail = t.out[len(ps)-max(len(ps)/10, 1)]
	c.survival = t
	return t
}
