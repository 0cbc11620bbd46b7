package bench

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// strategyColors keeps a strategy's colour the same on every chart.
var strategyColors = map[string]color.RGBA{
	"retry":     {R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"ratelimit": {R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	"shaping":   {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	"adaptive":  {R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	"auto":      {R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
}

// chartSmooth is the moving-average width of the charts, in seconds (odd).
const chartSmooth = 5

// writeChart renders admitted throughput per second of the binding
// dimension, one line per strategy, with the limit in force dashed.
func writeChart(path string, sc Scenario, runs []*RunResult) error {
	p := plot.New()
	unit := "requests"
	if len(runs) > 0 {
		unit = runs[0].Binding
	}
	p.Title.Text = fmt.Sprintf("llmq bench: %s (%s/s admitted by the provider, %d s moving average)", sc.Name, unit, chartSmooth)
	p.X.Label.Text = "seconds since start"
	p.Y.Label.Text = unit + " per second"
	p.Legend.Top = true
	p.Legend.Left = false
	p.Add(plotter.NewGrid())

	if len(runs) > 0 {
		lim := make(plotter.XYs, len(runs[0].Series))
		for i, pt := range runs[0].Series {
			lim[i].X, lim[i].Y = float64(pt.T), pt.Limit
		}
		l, err := plotter.NewLine(lim)
		if err != nil {
			return fmt.Errorf("chart %s: %w", sc.Name, err)
		}
		l.Color = color.Black
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add("limit", l)
	}
	for _, r := range runs {
		xy := make(plotter.XYs, len(r.Series))
		for i, pt := range r.Series {
			// centred moving average over chartSmooth seconds
			var sum float64
			n := 0
			for j := max(0, i-chartSmooth/2); j <= min(len(r.Series)-1, i+chartSmooth/2); j++ {
				sum += r.Series[j].Units
				n++
			}
			xy[i].X, xy[i].Y = float64(pt.T), sum/float64(n)
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return fmt.Errorf("chart %s: %w", sc.Name, err)
		}
		c, ok := strategyColors[r.Strategy]
		if !ok {
			c = color.RGBA{A: 0xff}
		}
		l.Color = c
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(r.Strategy, l)
	}
	p.Y.Min = 0
	if err := p.Save(10*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return fmt.Errorf("save chart %s: %w", path, err)
	}
	return nil
}

// Replot renders the charts of a results.json written earlier into dir.
func Replot(resultsPath, dir string) error {
	b, err := os.ReadFile(resultsPath)
	if err != nil {
		return fmt.Errorf("read results: %w", err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("decode %s: %w", resultsPath, err)
	}
	for _, s := range rep.Scenarios {
		if err := writeChart(filepath.Join(dir, s.Scenario.Name+".png"), s.Scenario, s.Runs); err != nil {
			return err
		}
	}
	return nil
}
