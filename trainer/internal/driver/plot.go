package driver

import (
	"encoding/json"
	"fmt"
	"gpukit/libgpu/atomicfile"
	"image/color"
	"io"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Colours of the plot: the training loss (its line and a dot per loss
// line, so a run with one loss line still shows it), the validation loss,
// and the accuracies.
var (
	lossColor = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	valColor  = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	accColors = []color.RGBA{{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, {R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, {R: 0x94, G: 0x67, B: 0xbd, A: 0xff}}
)

// series are the curves of a metrics file: the training loss of every
// loss line, the validation loss of every evaluation line (val_loss), and
// each accuracy the evaluation lines carry (fields named *accuracy; a
// loss line's are left out).
type series struct {
	train, val plotter.XYs
	acc        map[string]plotter.XYs
}

func readSeries(metrics string) (series, error) {
	s := series{acc: map[string]plotter.XYs{}}
	err := metricLines(metrics, func(b []byte) {
		var l map[string]any
		if json.Unmarshal(b, &l) != nil {
			return
		}
		step, ok := l["step"].(float64)
		if !ok {
			return
		}
		if v, ok := l["loss"].(float64); ok {
			// A loss line: its accuracies (the HRM's, over the sequences
			// that halted at that step, 0 where none did) are not the
			// evaluations'.
			s.train = append(s.train, plotter.XY{X: step, Y: v})
			return
		}
		if v, ok := l["val_loss"].(float64); ok {
			s.val = append(s.val, plotter.XY{X: step, Y: v})
		}
		for k, x := range l {
			if v, ok := x.(float64); ok && strings.HasSuffix(k, "accuracy") {
				s.acc[k] = append(s.acc[k], plotter.XY{X: step, Y: v})
			}
		}
	})
	return s, err
}

// Plot reads the lines of a metrics.jsonl file and draws into a PNG at out
// (15×10 cm; 15×16 with accuracies): the training loss against the step
// as a line with a dot per loss line, the validation loss beside it, and,
// when the evaluations carry accuracies (the MLP's test_accuracy), those
// in a panel below. lossLabel names the loss ("cross-entropy"); a run
// with no loss lines (fewer steps than --log-every) gets a title that
// says so. The PNG is written to a temporary file renamed over out.
func Plot(metrics, out, lossLabel string) error {
	s, err := readSeries(metrics)
	if err != nil {
		return err
	}
	top, err := lossPlot(s, lossLabel)
	if err != nil {
		return err
	}
	rows := [][]*plot.Plot{{top}}
	h := 10 * vg.Centimeter
	if len(s.acc) > 0 {
		bottom, err := accuracyPlot(s.acc)
		if err != nil {
			return err
		}
		rows = append(rows, []*plot.Plot{bottom})
		h = 16 * vg.Centimeter
	}
	img := vgimg.New(15*vg.Centimeter, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(rows), Cols: 1, PadY: vg.Millimeter}
	canvases := plot.Align(rows, tiles, dc)
	for i, r := range rows {
		r[0].Draw(canvases[i][0])
	}
	err = atomicfile.Write(out, atomicfile.Options{}, func(w io.Writer) error {
		_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
		return err
	})
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	return nil
}

// lossPlot draws the training loss (a line with a dot per point) and the
// validation loss.
func lossPlot(s series, label string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "training loss"
	p.X.Label.Text = "step"
	p.Y.Label.Text = label
	if len(s.train) == 0 && len(s.val) == 0 {
		p.Title.Text = "training loss: no loss lines yet (the run had fewer steps than --log-every)"
		return p, nil
	}
	p.Add(plotter.NewGrid())
	for _, c := range []struct {
		pts   plotter.XYs
		col   color.RGBA
		name  string
		glyph draw.GlyphDrawer
	}{{s.train, lossColor, "training", draw.CircleGlyph{}}, {s.val, valColor, "validation", draw.SquareGlyph{}}} {
		if len(c.pts) == 0 {
			continue
		}
		line, dots, err := plotter.NewLinePoints(c.pts)
		if err != nil {
			return nil, fmt.Errorf("trainer: plot: %w", err)
		}
		line.Color, dots.Color = c.col, c.col
		dots.Shape, dots.Radius = c.glyph, vg.Points(2)
		p.Add(line, dots)
		if len(s.val) > 0 {
			p.Legend.Add(c.name, line, dots)
		}
	}
	if len(s.val) > 0 {
		p.Title.Text = "training and validation loss"
		p.Legend.Top = true
	}
	return p, nil
}

// accuracyPlot draws each accuracy against the step.
func accuracyPlot(acc map[string]plotter.XYs) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "accuracy"
	p.X.Label.Text = "step"
	p.Y.Label.Text = "fraction right"
	p.Add(plotter.NewGrid())
	names := make([]string, 0, len(acc))
	for k := range acc {
		names = append(names, k)
	}
	sort.Strings(names)
	for i, k := range names {
		line, dots, err := plotter.NewLinePoints(acc[k])
		if err != nil {
			return nil, fmt.Errorf("trainer: plot: %w", err)
		}
		col := accColors[i%len(accColors)]
		line.Color, dots.Color = col, col
		dots.Shape, dots.Radius = draw.CircleGlyph{}, vg.Points(2)
		p.Add(line, dots)
		p.Legend.Add(strings.ReplaceAll(k, "_", " "), line, dots)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return p, nil
}
