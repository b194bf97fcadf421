package driver

import (
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// lossPixels counts the pixels of loss.png drawn in the loss's colour.
func lossPixels(t *testing.T, metrics string) int {
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
			if r>>8 == uint32(lossColor.R) && g>>8 == uint32(lossColor.G) && bl>>8 == uint32(lossColor.B) {
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
