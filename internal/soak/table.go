package soak

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Growth is an incarnation's RSS growth from its warm sample to its last,
// and whether there are both.
func (inc Incarnation) Growth() (float64, bool) { return growth(inc.Start.RSS, inc.Last.RSS) }

// AnonGrowth is the same for the anonymous part (heap, stacks).
func (inc Incarnation) AnonGrowth() (float64, bool) { return growth(inc.Start.Anon, inc.Last.Anon) }

func growth(start, end int64) (float64, bool) {
	if start <= 0 || end <= 0 {
		return 0, false
	}
	return float64(end-start) / float64(start), true
}

func pctOrDash(g float64, ok bool) string {
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%+.1f%%", 100*g)
}

// WholeRun reports whether the incarnation lived from before the load
// started to its end: the ones whose growth says whether memory leaks.
func (inc Incarnation) WholeRun(loadStart time.Time) bool {
	return inc.Ended.IsZero() && !inc.Started.After(loadStart)
}

// Verdict is the must-show: nothing lost, nothing duplicated, and no
// llmq process that lived through the whole run grew more than maxGrowth.
func (r *Report) Verdict(maxGrowth float64) (ok bool, why []string) {
	s := r.Summary
	if n := len(s.Lost); n > 0 {
		why = append(why, fmt.Sprintf("%d lost", n))
	}
	if n := len(s.Duplicated); n > 0 {
		why = append(why, fmt.Sprintf("%d duplicated", n))
	}
	for _, inc := range r.Procs {
		if g, ok := inc.Growth(); ok && inc.WholeRun(r.Started) && !inc.Witness && g > maxGrowth {
			why = append(why, fmt.Sprintf("%s RSS grew %.1f%%", inc.Name, 100*g))
		}
	}
	return len(why) == 0, why
}

// Print writes the report as Markdown.
func (r *Report) Print(w io.Writer) {
	p, s := r.Plan, r.Summary
	fmt.Fprintf(w, "llmq soak: %v at %.0f%% of RPM %d (%.1f jobs/s, half POST /v1/jobs, half raw on llmq.jobs), TPM %d, %d consumers, started %s\n\n",
		p.Duration, 100*p.Load, p.RPM, r.Rate, p.TPM, p.Consumers, r.Started.UTC().Format(time.RFC3339))

	fmt.Fprintf(w, "| jobs | count |\n|---|---|\n")
	fmt.Fprintf(w, "| accepted (202 or publisher confirm) | %d (http %d, amqp %d) |\n", s.Accepted, s.AcceptedVia["http"], s.AcceptedVia["amqp"])
	fmt.Fprintf(w, "| succeeded | %d |\n", s.Succeeded)
	fmt.Fprintf(w, "| ended failed / dead / cancelled | %d / %d / %d |\n", s.OtherFinal["failed"], s.OtherFinal["dead"], s.OtherFinal["cancelled"])
	fmt.Fprintf(w, "| **lost** | **%d** |\n", len(s.Lost))
	fmt.Fprintf(w, "| **duplicated** (finished twice: two distinct terminal events) | **%d** |\n", len(s.Duplicated))
	fmt.Fprintf(w, "| provider call paid twice, result stored and sent once | %d |\n", s.Repaid)
	fmt.Fprintf(w, "| result events redelivered with the same event_id (deduped) | %d |\n", s.Redelivered)
	fmt.Fprintf(w, "| submissions never acknowledged (given up after %v) | http %d, amqp %d |\n", giveUp, r.NotAccepted["http"], r.NotAccepted["amqp"])
	fmt.Fprintf(w, "| provider calls (llmsim) | %d (llmsim's own count %d) |\n", s.Requests, r.SimRequests)
	fmt.Fprintf(w, "| 429 share | %.2f%% (%d) |\n", s.RateLimitPct, s.RateLimited)
	fmt.Fprintf(w, "| queue time p50 / p99 / max (ack → first provider call) | %v / %v / %v |\n",
		s.QueueP50.Round(time.Millisecond), s.QueueP99.Round(time.Millisecond), s.QueueMax.Round(time.Millisecond))
	if r.LoadMinutes > 0 {
		fmt.Fprintf(w, "| provider load over the run | %.0f calls/min (%.0f%% of RPM), %.0f tokens/min (%.0f%% of TPM) |\n",
			float64(r.SimRequests)/r.LoadMinutes, 100*float64(r.SimRequests)/r.LoadMinutes/float64(p.RPM),
			float64(r.SimTokens)/r.LoadMinutes, 100*float64(r.SimTokens)/r.LoadMinutes/float64(p.TPM))
	}
	fmt.Fprintf(w, "| drain after the load | %v (all settled: %v) |\n\n", r.DrainTook.Round(time.Second), r.Drained)

	fmt.Fprintf(w, "| process | pid | lived | RSS start (mean of the minute after +%v) | RSS end (mean of the last minute) | growth | of it anonymous: start → end (growth) | ended |\n|---|---|---|---|---|---|---|---|\n", p.Warmup)
	procs := append([]Incarnation(nil), r.Procs...)
	sort.SliceStable(procs, func(i, j int) bool { return procs[i].Name < procs[j].Name })
	for _, inc := range procs {
		end := inc.Ended
		if end.IsZero() {
			end = r.Started.Add(time.Duration(r.LoadMinutes * float64(time.Minute)))
		}
		ended := inc.End
		if inc.Witness {
			ended += "; not judged: the ledger keeps a record per job"
		}
		fmt.Fprintf(w, "| %s | %d | %s–%s | %s | %s | %s | %s → %s (%s) | %s |\n", inc.Name, inc.PID,
			offset(r.Started, inc.Started), offset(r.Started, end), mb(inc.Start.RSS), mb(inc.Last.RSS), pctOrDash(inc.Growth()),
			mb(inc.Start.Anon), mb(inc.Last.Anon), pctOrDash(inc.AnonGrowth()), ended)
	}

	fmt.Fprintf(w, "\n| at | fault | took | note |\n|---|---|---|---|\n")
	for _, f := range r.Faults {
		fmt.Fprintf(w, "| %s | %s %s | %v | %s |\n", offset(r.Started, f.Started), f.Kind, f.Target, f.Took.Round(time.Millisecond), strings.ReplaceAll(f.Note, "|", "\\|"))
	}
	ok, why := r.Verdict(0.10)
	fmt.Fprintf(w, "\nverdict: ")
	if ok {
		fmt.Fprintln(w, "lost 0, duplicated 0, no llmq process that lived through the run grew more than 10%")
	} else {
		fmt.Fprintln(w, "FAIL: "+strings.Join(why, "; "))
	}
	for _, pr := range append(append([]Problem(nil), s.Lost...), s.Duplicated...) {
		fmt.Fprintf(w, "  %s (%s): %s\n", pr.ID, pr.Via, pr.Reason)
	}
}

// offset is t as minutes:seconds after start; "0:00" for before it.
func offset(start, t time.Time) string {
	d := max(t.Sub(start), 0).Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}

func mb(kb int64) string {
	if kb <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f MB", float64(kb)/1024)
}
