package train

import (
	"bufio"
	"encoding/json"
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// lossColor draws the loss: its line and a dot per loss line, so a run
// with one loss line (fewer than two --log-every intervals) still shows it.
var lossColor = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}

// Plot reads the loss lines of a metrics.jsonl file and draws loss against
// step into a PNG at out (15×10 cm): a line with a dot per loss line, or,
// for a run with none (fewer steps than --log-every), a title that says so.
func Plot(metrics, out string) error {
	f, err := os.Open(metrics)
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	defer f.Close()
	var pts plotter.XYs
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l struct {
			Step int      `json:"step"`
			Loss *float64 `json:"loss"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Loss == nil {
			continue
		}
		pts = append(pts, plotter.XY{X: float64(l.Step), Y: *l.Loss})
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("train: reading %s: %w", metrics, err)
	}
	p, err := lossPlot(pts)
	if err != nil {
		return err
	}
	if err := p.Save(15*vg.Centimeter, 10*vg.Centimeter, out); err != nil {
		return fmt.Errorf("train: writing %s: %w", out, err)
	}
	return nil
}

// lossPlot draws pts (step, loss) as a line with a dot per point.
func lossPlot(pts plotter.XYs) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "training loss"
	p.X.Label.Text = "step"
	p.Y.Label.Text = "cross-entropy"
	if len(pts) == 0 {
		p.Title.Text = "training loss: no loss lines yet (the run had fewer steps than --log-every)"
		return p, nil
	}
	line, dots, err := plotter.NewLinePoints(pts)
	if err != nil {
		return nil, fmt.Errorf("train: plot: %w", err)
	}
	line.Color = lossColor
	dots.Color = lossColor
	dots.Shape = draw.CircleGlyph{}
	dots.Radius = vg.Points(2)
	p.Add(plotter.NewGrid(), line, dots)
	return p, nil
}
