// Command gpukit-optimplot draws the validation loss of several training
// runs (trainer's metrics.jsonl: {step, val_loss, elapsed_s} lines) against
// steps and against seconds, side by side, into one PNG, and prints one
// JSON line per run: its final and best validation loss, and the step and
// seconds at which it first reached the baseline's (the first run's) best
// validation loss, over the step and seconds at which the baseline first
// reached it — issue 26's "wall-clock to AdamW's best validation loss".
// (A recipe that overfits, as nanoGPT's shakespeare-char does after about
// 1500 steps, ends above its best: its final loss would be a target every
// run meets early.)
//
//	gpukit-optimplot -o out.png NAME=metrics.jsonl [NAME=metrics.jsonl ...]
//
// The first run is the baseline.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// run is one labelled metrics file's validation points.
type run struct {
	name  string
	steps plotter.XYs // (step, val_loss)
	secs  plotter.XYs // (elapsed_s, val_loss)
}

func read(name, path string) (run, error) {
	r := run{name: name}
	f, err := os.Open(path)
	if err != nil {
		return r, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l struct {
			Step    int      `json:"step"`
			ValLoss *float64 `json:"val_loss"`
			Elapsed *float64 `json:"elapsed_s"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.ValLoss == nil {
			continue
		}
		r.steps = append(r.steps, plotter.XY{X: float64(l.Step), Y: *l.ValLoss})
		if l.Elapsed != nil {
			r.secs = append(r.secs, plotter.XY{X: *l.Elapsed, Y: *l.ValLoss})
		}
	}
	if err := sc.Err(); err != nil {
		return r, err
	}
	if len(r.steps) == 0 {
		return r, fmt.Errorf("%s: no val_loss lines", path)
	}
	return r, nil
}

// Summary is the JSON line of one run.
type Summary struct {
	Name         string   `json:"name"`
	FinalValLoss float64  `json:"final_val_loss"`
	BestValLoss  float64  `json:"best_val_loss"`
	Steps        int      `json:"steps"`
	Seconds      float64  `json:"seconds"`
	BaseLoss     float64  `json:"baseline_val_loss"`   // the baseline's best validation loss
	StepsToBase  *float64 `json:"steps_to_baseline"`   // first evaluated step at or below BaseLoss (null: never)
	SecsToBase   *float64 `json:"seconds_to_baseline"` // its elapsed seconds
	StepRatio    *float64 `json:"step_ratio"`          // StepsToBase / the baseline's own
	TimeRatio    *float64 `json:"time_ratio"`          // SecsToBase / the baseline's own
}

func summarise(rs []run) []Summary {
	base := rs[0]
	bi := 0 // the baseline's first point at its best loss
	for i, p := range base.steps {
		if p.Y < base.steps[bi].Y {
			bi = i
		}
	}
	target, baseSteps, baseSecs := base.steps[bi].Y, base.steps[bi].X, 0.0
	if bi < len(base.secs) {
		baseSecs = base.secs[bi].X
	}
	var out []Summary
	for _, r := range rs {
		s := Summary{Name: r.name, FinalValLoss: r.steps[len(r.steps)-1].Y, Steps: int(r.steps[len(r.steps)-1].X),
			BestValLoss: r.steps[0].Y, BaseLoss: target}
		if len(r.secs) > 0 {
			s.Seconds = r.secs[len(r.secs)-1].X
		}
		for i, p := range r.steps {
			s.BestValLoss = min(s.BestValLoss, p.Y)
			if s.StepsToBase == nil && p.Y <= target {
				st := p.X
				s.StepsToBase = &st
				if baseSteps > 0 {
					q := st / baseSteps
					s.StepRatio = &q
				}
				if i < len(r.secs) {
					sec := r.secs[i].X
					s.SecsToBase = &sec
					if baseSecs > 0 {
						q := sec / baseSecs
						s.TimeRatio = &q
					}
				}
			}
		}
		out = append(out, s)
	}
	return out
}

var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
	color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
}

func panel(rs []run, secs bool) (*plot.Plot, error) {
	p := plot.New()
	p.Y.Label.Text = "validation loss"
	p.X.Label.Text = "step"
	p.Title.Text = "validation loss against steps"
	if secs {
		p.X.Label.Text = "seconds"
		p.Title.Text = "validation loss against wall-clock time"
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	for i, r := range rs {
		pts := r.steps
		if secs {
			pts = r.secs
		}
		if len(pts) == 0 {
			continue
		}
		line, dots, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		c := palette[i%len(palette)]
		line.Color, dots.Color = c, c
		line.Width = vg.Points(1.5)
		dots.Shape, dots.Radius = draw.CircleGlyph{}, vg.Points(1.5)
		p.Add(line, dots)
		p.Legend.Add(r.name, line)
	}
	return p, nil
}

func run1() error {
	out := flag.String("o", "optim.png", "the PNG to write")
	flag.Parse()
	if flag.NArg() == 0 {
		return errors.New("usage: gpukit-optimplot -o out.png NAME=metrics.jsonl [NAME=metrics.jsonl]")
	}
	var rs []run
	for _, a := range flag.Args() {
		name, path, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("%q: want NAME=metrics.jsonl", a)
		}
		r, err := read(name, path)
		if err != nil {
			return err
		}
		rs = append(rs, r)
	}
	left, err := panel(rs, false)
	if err != nil {
		return err
	}
	right, err := panel(rs, true)
	if err != nil {
		return err
	}
	const w, h = 30 * vg.Centimeter, 11 * vg.Centimeter
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2,
		PadRight: vg.Millimeter * 2, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{{left, right}}, tiles, dc)
	left.Draw(canvases[0][0])
	right.Draw(canvases[0][1])
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	for _, s := range summarise(rs) {
		if err := enc.Encode(s); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	if err := run1(); err != nil {
		fmt.Fprintln(os.Stderr, "gpukit-optimplot:", err)
		os.Exit(1)
	}
}
