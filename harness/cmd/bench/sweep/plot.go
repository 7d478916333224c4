package sweep

import (
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/vramq/vramq/harness/cmd/bench/report"
)

// plotSweep draws throughput over the bound per strategy (one line each)
// against the shapes.
func plotSweep(path string, rep sweepReport) error {
	if len(rep.Shapes) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = "Throughput / offline bound, per row"
	p.Y.Label.Text = "% of the offline bound"
	p.X.Label.Text = "workload (shape, estimate error, subscribers)"
	p.Y.Min, p.Y.Max = 0, 105
	names := make([]string, len(rep.Shapes))
	for i, s := range rep.Shapes {
		names[i] = s.Label
	}
	// One colour per strategy in every plot.
	palette := map[string]color.RGBA{"none": {214, 39, 40, 255}, "count-1": {255, 127, 14, 255}, "count-avg": {148, 103, 189, 255},
		"vram-plain": {44, 160, 44, 255}, "vram": {31, 119, 180, 255}}
	for j, o := range rep.Shapes[0].Results {
		xys := make(plotter.XYs, len(rep.Shapes))
		for i, s := range rep.Shapes {
			xys[i].X = float64(i)
			if j < len(s.Results) {
				xys[i].Y = 100 * s.Results[j].OfBound
			}
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return err
		}
		c, ok := palette[o.Name]
		if !ok {
			c = color.RGBA{A: 255}
		}
		line.Color, points.Color = c, c
		p.Add(line, points)
		p.Legend.Add(o.Name, line, points)
	}
	p.Add(plotter.NewGrid())
	// Bottom left: below every line on the bimodal shapes.
	p.Legend.Top, p.Legend.Left = false, true
	p.Legend.XOffs = vg.Points(8)
	p.NominalX(names...)
	img := vgimg.New(8*vg.Inch, 4.5*vg.Inch)
	p.Draw(draw.New(img))
	return report.WritePNG(path, img)
}
