package driver

import (
	"fmt"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// lossPixels counts the pixels of loss.png drawn in the loss's colour.
func lossPixels(t *testing.T, metrics string) int {
	return colourPixels(t, metrics, lossColor)
}

// colourPixels counts the pixels of the plot of metrics drawn in col.
func colourPixels(t *testing.T, metrics string, col color.RGBA) int {
	t.Helper()
	dir := t.TempDir()
	m, out := filepath.Join(dir, MetricsFile), filepath.Join(dir, PlotFile)
	if err := os.WriteFile(m, []byte(metrics), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Plot(m, out, "cross-entropy"); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r>>8 == uint32(col.R) && g>>8 == uint32(col.G) && bl>>8 == uint32(col.B) {
				n++
			}
		}
	}
	return n
}

// TestPlotShortRun: a run with a single loss line (fewer than two
// --log-every intervals) draws it; with none, nothing is drawn in the loss
// colour and the title says why.
func TestPlotShortRun(t *testing.T) {
	one := `{"step":50,"epoch":1,"loss":2.1,"lr":0.001}` + "\n" + `{"step":60,"epoch":1,"test_accuracy":0.5}` + "\n"
	if n := lossPixels(t, one); n == 0 {
		t.Fatal("a single loss line is not drawn")
	}
	var many strings.Builder
	for i := 1; i <= 20; i++ {
		fmt.Fprintf(&many, `{"step":%d,"epoch":1,"loss":%g}`+"\n", 10*i, 2.0/float64(i))
	}
	if n1, n20 := lossPixels(t, one), lossPixels(t, many.String()); n20 <= n1 {
		t.Fatalf("20 loss lines draw %d pixels, one %d", n20, n1)
	}
	if n := lossPixels(t, `{"step":10,"epoch":1,"test_accuracy":0.5}`+"\n"); n != 0 {
		t.Fatalf("no loss lines, yet %d pixels in the loss colour", n)
	}
	p, err := lossPlot(series{}, "cross-entropy")
	if err != nil || !strings.Contains(p.Title.Text, "no loss lines") {
		t.Fatalf("empty plot titled %q (%v)", p.Title.Text, err)
	}
}

// TestPlotValidationAndAccuracy: validation losses (val_loss) are drawn
// beside the training loss, and accuracies (fields named *accuracy) in a
// panel of their own; a run with neither draws neither.
func TestPlotValidationAndAccuracy(t *testing.T) {
	var gpt, mlp strings.Builder
	for i := 1; i <= 20; i++ {
		fmt.Fprintf(&gpt, `{"step":%d,"loss":%g}`+"\n", 10*i, 3.0/float64(i))
		fmt.Fprintf(&mlp, `{"step":%d,"epoch":1,"loss":%g}`+"\n", 10*i, 2.0/float64(i))
		if i%5 == 0 {
			fmt.Fprintf(&gpt, `{"step":%d,"val_loss":%g,"elapsed_s":1}`+"\n", 10*i, 3.2/float64(i))
			fmt.Fprintf(&mlp, `{"step":%d,"epoch":%d,"test_accuracy":%g}`+"\n", 10*i, i/5, 0.5+float64(i)/50)
		}
	}
	if n := colourPixels(t, gpt.String(), valColor); n == 0 {
		t.Error("validation losses are not drawn")
	}
	if n := colourPixels(t, gpt.String(), accColors[0]); n != 0 {
		t.Errorf("a run without accuracies has %d pixels in the accuracy colour", n)
	}
	if n := colourPixels(t, mlp.String(), accColors[0]); n == 0 {
		t.Error("test accuracies are not drawn")
	}
	if n := colourPixels(t, mlp.String(), valColor); n != 0 {
		t.Errorf("a run without validation losses has %d pixels in their colour", n)
	}
}

// TestPlotAccuraciesOfEvaluationsOnly: the accuracy panel draws the
// evaluation lines' accuracies, not those a loss line carries (the HRM's
// over the sequences that halted at that step, 0 where none did).
func TestPlotAccuraciesOfEvaluationsOnly(t *testing.T) {
	var m strings.Builder
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&m, `{"step":%d,"loss":2,"accuracy":%d,"exact_accuracy":0}`+"\n", i, i%2)
	}
	s, err := func() (series, error) {
		p := filepath.Join(t.TempDir(), MetricsFile)
		if err := os.WriteFile(p, []byte(m.String()+`{"step":10,"test_cell_accuracy":0.4}`+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return readSeries(p)
	}()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.train) != 10 || len(s.acc) != 1 || len(s.acc["test_cell_accuracy"]) != 1 {
		t.Fatalf("%d loss points, accuracies %v", len(s.train), s.acc)
	}
}
