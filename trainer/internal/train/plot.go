package train

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Plot reads the loss lines of a metrics.jsonl file and draws loss against
// step into a PNG at out (15×10 cm).
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
	p := plot.New()
	p.Title.Text = "training loss"
	p.X.Label.Text = "step"
	p.Y.Label.Text = "cross-entropy"
	if len(pts) > 0 {
		line, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("train: plot: %w", err)
		}
		p.Add(line, plotter.NewGrid())
	}
	if err := p.Save(15*vg.Centimeter, 10*vg.Centimeter, out); err != nil {
		return fmt.Errorf("train: writing %s: %w", out, err)
	}
	return nil
}
