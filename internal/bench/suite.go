package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/internal/ratecontrol"
)

// Options configure a suite run.
type Options struct {
	Env        Env
	Scenarios  []Scenario
	Strategies []ratecontrol.Strategy
	// Out is the directory for <scenario>.png and results.json ("" = none).
	Out string
	// Sequential runs the strategies of a scenario one after another
	// instead of side by side (each has its own simulator, database and
	// worker either way).
	Sequential bool
	// Stdout receives the tables, Stderr the progress.
	Stdout, Stderr io.Writer
}

// Report is the JSON file: every scenario's settings and runs.
type Report struct {
	Generated time.Time        `json:"generated"`
	Scenarios []ScenarioReport `json:"scenarios"`
}

// ScenarioReport is one scenario's settings and its runs.
type ScenarioReport struct {
	Scenario Scenario     `json:"scenario"`
	Runs     []*RunResult `json:"runs"`
}

// RunSuite runs every strategy through every scenario, prints a table per
// scenario and writes the charts and the JSON report to Out.
func RunSuite(ctx context.Context, o Options) (*Report, error) {
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	if o.Out != "" {
		if err := os.MkdirAll(o.Out, 0o755); err != nil {
			return nil, fmt.Errorf("create output directory: %w", err)
		}
	}
	rep := &Report{Generated: time.Now().UTC()}
	for _, sc := range o.Scenarios {
		if err := sc.Validate(); err != nil {
			return nil, err
		}
		fmt.Fprintf(o.Stderr, "scenario %s: %s (%v, strategies %v)\n", sc.Name, sc.Description, sc.Duration, o.Strategies)
		runs := make([]*RunResult, len(o.Strategies))
		errs := make([]error, len(o.Strategies))
		var wg sync.WaitGroup
		for i, s := range o.Strategies {
			run := func() { runs[i], errs[i] = Run(ctx, o.Env, sc, s) }
			if o.Sequential {
				run()
				continue
			}
			wg.Add(1)
			go func() { defer wg.Done(); run() }()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				return rep, fmt.Errorf("scenario %s, strategy %s: %w", sc.Name, o.Strategies[i], err)
			}
		}
		rep.Scenarios = append(rep.Scenarios, ScenarioReport{Scenario: sc, Runs: runs})
		WriteTable(o.Stdout, sc, runs)
		if o.Out != "" {
			if err := writeChart(filepath.Join(o.Out, sc.Name+".png"), sc, runs); err != nil {
				return rep, err
			}
			if err := WriteJSON(filepath.Join(o.Out, "results.json"), rep); err != nil {
				return rep, err
			}
		}
	}
	return rep, nil
}

// WriteJSON writes the report to path.
func WriteJSON(path string, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// WriteTable prints one scenario's runs as a Markdown table.
func WriteTable(w io.Writer, sc Scenario, runs []*RunResult) {
	fmt.Fprintf(w, "\n### %s\n%s\n\n", sc.Name, sc.Description)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| strategy\t| goodput (steady)\t| goodput (run)\t| t90\t| 429 share\t| p50\t| p99\t| calls/success\t| succeeded\t| failed\t| dead\t| unfinished\t| overruns\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, r := range runs {
		t90 := "never"
		if r.T90 >= 0 {
			t90 = fmt.Sprintf("%.0fs", r.T90)
		}
		fmt.Fprintf(tw, "| %s\t| %.1f%%\t| %.1f%%\t| %s\t| %.2f%%\t| %s\t| %s\t| %.2f\t| %d\t| %d\t| %d\t| %d\t| %d\t|\n",
			r.Strategy, 100*r.Goodput, 100*r.GoodputRun, t90, 100*r.Share429,
			secs(r.LatencyP50), secs(r.LatencyP99), r.CallsPerSuccess, r.Succeeded, r.Failed, r.Dead, r.Unfinished, r.Overruns)
	}
	_ = tw.Flush()
	if len(runs) > 0 {
		fmt.Fprintf(w, "\nbroker: %s; binding: %s; steady window [%.0fs, %.0fs); run %v; t90 counted from the last event\n", runs[0].Broker, runs[0].Binding, runs[0].MeasureFrom, runs[0].MeasureTo, sc.Duration)
	}
}

func secs(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fs", v)
}
