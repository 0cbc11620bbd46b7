package bench

import (
	"math"
	"slices"
	"time"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/sim"
)

// RunResult is one strategy's outcome in one scenario.
type RunResult struct {
	Scenario string `json:"scenario"`
	Strategy string `json:"strategy"`
	// Broker is what the jobs went through (Env.Broker).
	Broker string `json:"broker,omitempty"`
	// ViaHTTP counts the jobs submitted over the producer API (the rest
	// were published raw onto the broker).
	ViaHTTP int `json:"via_http"`
	// HTTPRetries counts the submissions the API answered 503 or 429 and
	// the bench sent again with the same id.
	HTTPRetries int `json:"http_retries,omitempty"`
	// Binding is the dimension that bound the run: "requests" or "tokens".
	Binding string `json:"binding"`
	// Goodput is the admitted traffic of the binding dimension over the
	// steady window [MeasureFrom, MeasureTo) as a share of the limit in
	// force; GoodputRun is the same over the whole run (over a run that is
	// not whole minutes, a client front-loading a minute's quota can show
	// more than 100% there).
	Goodput     float64 `json:"goodput"`
	GoodputRun  float64 `json:"goodput_run"`
	MeasureFrom float64 `json:"measure_from_s"`
	MeasureTo   float64 `json:"measure_to_s"`
	// T90 is how long after the last event (start, second backlog, limit
	// change) the 3 s average first reached 90% of the limit; -1 = never.
	T90 float64 `json:"t90_s"`
	// Calls are the chat requests that reached the provider; RateLimited
	// the 429s among them.
	Calls       int64   `json:"calls"`
	RateLimited int64   `json:"rate_limited"`
	Share429    float64 `json:"share_429"`
	// RateLimitedBy splits the 429s by the simulator's reason (rpm, tpm,
	// rps, tps, burst).
	RateLimitedBy map[sim.Reason]int64 `json:"rate_limited_by,omitempty"`
	// CallsPerSuccess is provider calls per succeeded job: what a useful
	// result cost (in overload many jobs are unfinished at the stop, so
	// calls per started job understates retries).
	CallsPerSuccess float64 `json:"calls_per_success"`
	JobsCalled      int     `json:"jobs_called"` // jobs that reached the provider
	Jobs            int     `json:"jobs"`
	Succeeded       int     `json:"succeeded"`
	Failed          int     `json:"failed"`
	Dead            int     `json:"dead"`
	Unfinished      int     `json:"unfinished"`
	LatencyP50      float64 `json:"latency_p50_s"` // publish → result stored, succeeded jobs
	LatencyP99      float64 `json:"latency_p99_s"`
	Overruns        int64   `json:"overruns"` // simulator referee: must be 0
	PeakInFlight    int64   `json:"peak_in_flight"`
	// DuplicateSuccesses counts jobs that got more than one successful call.
	DuplicateSuccesses int `json:"duplicate_successes"`
	// Series is one point per second since the start.
	Series []Point `json:"series"`
}

// Point is one second of a run.
type Point struct {
	T           int64   `json:"t"` // seconds since the start
	Requests    int64   `json:"requests"`
	Tokens      int64   `json:"tokens"`
	RateLimited int64   `json:"rate_limited"`
	Limit       float64 `json:"limit"` // binding limit per second in force
	Units       float64 `json:"units"` // admitted units of the binding dimension
}

func summarize(sc Scenario, strategy ratecontrol.Strategy, start time.Time, st sim.ModelStats, rows []jobRow, published map[string]time.Time) *RunResult {
	r := &RunResult{Scenario: sc.Name, Strategy: string(strategy), Jobs: len(published),
		Calls: st.Requests, RateLimited: st.RateLimitedTotal, PeakInFlight: st.PeakInFlight,
		MeasureFrom: sc.measureFrom().Seconds()}
	for _, v := range st.Overruns {
		r.Overruns += v
	}
	for reason, n := range st.RateLimited {
		if n > 0 {
			if r.RateLimitedBy == nil {
				r.RateLimitedBy = map[sim.Reason]int64{}
			}
			r.RateLimitedBy[reason] = n
		}
	}
	if r.Calls > 0 {
		r.Share429 = float64(r.RateLimited) / float64(r.Calls)
	}

	secs := int64(sc.Duration / time.Second)
	startSec := start.Unix()
	pts := make([]Point, secs)
	for i := range pts {
		pts[i].T = int64(i)
	}
	for _, s := range st.Series {
		i := s.Unix - startSec
		if i < 0 || i >= secs {
			continue
		}
		pts[i].Requests += s.Requests
		pts[i].Tokens += s.Tokens
		pts[i].RateLimited += s.RateLimited
	}
	// The binding dimension is the one used closest to its limit overall.
	var reqU, tokU, reqL, tokL float64
	for i := range pts {
		rl, tl := sc.limitsAt(time.Duration(i)*time.Second + time.Second/2)
		if rl > 0 {
			reqU += float64(pts[i].Requests)
			reqL += rl
		}
		if tl > 0 {
			tokU += float64(pts[i].Tokens)
			tokL += tl
		}
	}
	tokens := tokL > 0 && (reqL == 0 || tokU/tokL > reqU/reqL)
	r.Binding = "requests"
	if tokens {
		r.Binding = "tokens"
	}
	for i := range pts {
		rl, tl := sc.limitsAt(time.Duration(i)*time.Second + time.Second/2)
		if tokens {
			pts[i].Limit, pts[i].Units = tl, float64(pts[i].Tokens)
		} else {
			pts[i].Limit, pts[i].Units = rl, float64(pts[i].Requests)
		}
	}
	r.Series = pts
	r.Goodput = goodput(pts, int64(sc.measureFrom()/time.Second), min(int64(sc.measureTo()/time.Second), secs-1))
	r.MeasureTo = sc.measureTo().Seconds()
	r.GoodputRun = goodput(pts, 0, secs-1)
	event := time.Duration(0)
	for _, p := range sc.Phases {
		event = max(event, p.At)
	}
	if sc.Change != nil {
		event = max(event, sc.Change.At)
	}
	r.T90 = t90(pts, int64(event/time.Second))

	var lat []float64
	for _, row := range rows {
		switch row.Status {
		case job.StatusSucceeded:
			r.Succeeded++
			if at, ok := published[row.ID]; ok && row.CompletedAt != nil {
				lat = append(lat, row.CompletedAt.Sub(at).Seconds())
			}
		case job.StatusFailed:
			r.Failed++
		case job.StatusDead:
			r.Dead++
		}
	}
	r.Unfinished = r.Jobs - r.Succeeded - r.Failed - r.Dead
	if r.Succeeded > 0 {
		r.CallsPerSuccess = float64(r.Calls) / float64(r.Succeeded)
	}
	slices.Sort(lat)
	r.LatencyP50, r.LatencyP99 = quantile(lat, 0.5), quantile(lat, 0.99)
	return r
}

// goodput is Σ units / Σ limit over seconds [from, to).
func goodput(pts []Point, from, to int64) float64 {
	var u, l float64
	for i := max(from, 0); i < min(to, int64(len(pts))); i++ {
		u += pts[i].Units
		l += pts[i].Limit
	}
	if l == 0 {
		return 0
	}
	return u / l
}

// t90 is the first second s ≥ from where the average over [s, s+3)
// reaches 90% of the limit, minus from; -1 if never.
func t90(pts []Point, from int64) float64 {
	for s := from; s+3 <= int64(len(pts)); s++ {
		if goodput(pts, s, s+3) >= 0.9 {
			return float64(s - from)
		}
	}
	return -1
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return -1
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
