package strategies

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/vramq/vramq/harness/cmd/bench/report"
)

// plotBudget draws device memory in use over time, one panel per strategy
// on the same time axis, as a percentage of the budget.
func plotBudget(path string, rep strategyReport) error {
	n := len(rep.Results)
	if n == 0 {
		return nil
	}
	var end float64
	for _, o := range rep.Results {
		if len(o.Samples) > 0 {
			end = max(end, o.Samples[len(o.Samples)-1].T)
		}
	}
	plots := make([][]*plot.Plot, n)
	top := 110.0
	for i, o := range rep.Results {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s: %.1f messages/s, %d device OOMs", o.Name, o.MessagesPerS, o.DeviceOOMs)
		p.Y.Label.Text = "% of budget"
		p.X.Min, p.X.Max = 0, end
		if i == n-1 {
			p.X.Label.Text = "seconds since the subscriber started"
		}
		used := make(plotter.XYs, len(o.Samples))
		admitted := make(plotter.XYs, len(o.Samples))
		for j, s := range o.Samples {
			used[j].X, used[j].Y = s.T, 100*float64(s.Used)/float64(rep.Params.Budget)
			admitted[j].X, admitted[j].Y = s.T, 100*float64(s.Admitted)/float64(rep.Params.Budget)
			top = max(top, admitted[j].Y)
		}
		usedLine, err := plotter.NewLine(used)
		if err != nil {
			return err
		}
		usedLine.Color = color.RGBA{R: 31, G: 119, B: 180, A: 255}
		admittedLine, err := plotter.NewLine(admitted)
		if err != nil {
			return err
		}
		admittedLine.Color = color.RGBA{R: 255, G: 127, B: 14, A: 200}
		full := plotter.NewFunction(func(float64) float64 { return 100 })
		full.Color = color.RGBA{R: 214, G: 39, B: 40, A: 255}
		full.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(plotter.NewGrid(), admittedLine, usedLine, full)
		if i == 0 {
			p.Legend.Add("admitted (estimated)", admittedLine)
			p.Legend.Add("allocated on the device", usedLine)
			p.Legend.Add("budget", full)
			p.Legend.Top = true
		}
		plots[i] = []*plot.Plot{p}
	}
	// One scale for every panel, so they compare at a glance.
	for _, row := range plots {
		row[0].Y.Min, row[0].Y.Max = 0, top*1.05
	}
	img := vgimg.New(9*vg.Inch, vg.Length(n)*2.2*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: n, Cols: 1, PadX: vg.Millimeter, PadY: 2 * vg.Millimeter, PadTop: vg.Millimeter,
		PadBottom: vg.Millimeter, PadLeft: vg.Millimeter, PadRight: 2 * vg.Millimeter}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	return report.WritePNG(path, img)
}

// plotThroughput draws each strategy's messages per second as a bar, with
// the offline bound as a dashed line.
func plotThroughput(path string, rep strategyReport) error {
	if len(rep.Results) == 0 {
		return nil
	}
	vals := make(plotter.Values, len(rep.Results))
	names := make([]string, len(rep.Results))
	for i, o := range rep.Results {
		vals[i], names[i] = o.MessagesPerS, o.Name
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Throughput per strategy (dashed: offline bound, %.1f messages/s)", rep.Bound.MessagesPerS)
	p.Y.Label.Text = "messages/s"
	p.Y.Min = 0
	p.Y.Max = max(rep.Bound.MessagesPerS, slicesMax(vals)) * 1.1
	bars, err := plotter.NewBarChart(vals, vg.Points(40))
	if err != nil {
		return err
	}
	bars.Color = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	boundLine := plotter.NewFunction(func(float64) float64 { return rep.Bound.MessagesPerS })
	boundLine.Color = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	boundLine.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(plotter.NewGrid(), bars, boundLine)
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
	img := vgimg.New(7*vg.Inch, 4*vg.Inch)
	p.Draw(draw.New(img))
	return report.WritePNG(path, img)
}

func slicesMax(v plotter.Values) float64 {
	var m float64
	for _, x := range v {
		m = max(m, x)
	}
	return m
}
