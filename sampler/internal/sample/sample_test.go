package sample

import (
	"bytes"
	"errors"
	"image"
	"image/color"
	"image/gif"
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/mat"
)

func TestPixel(t *testing.T) {
	for _, c := range []struct {
		v    float32
		want uint8
	}{{-1, 0}, {1, 255}, {0, 128}, {-2, 0}, {3, 255}, {float32(2*10.0/255 - 1), 10}} {
		if got := Pixel(c.v); got != c.want {
			t.Errorf("Pixel(%v) = %d, want %d", c.v, got, c.want)
		}
	}
}

// TestFrechetClosedForm: for Gaussians with commuting (diagonal)
// covariances, FD = |μ1 − μ2|² + Σ(√a_i − √b_i)²; for rotated ones the
// trace term is rotation-invariant; and FD(X, X) = 0.
func TestFrechetClosedForm(t *testing.T) {
	d := 5
	a := []float64{1, 2, 0.5, 3, 0.1}
	b := []float64{2, 2, 1, 0.5, 0.4}
	mu1 := []float64{0, 1, 2, 3, 4}
	mu2 := []float64{1, 1, 2, 2, 4}
	s1, s2 := mat.NewSymDense(d, nil), mat.NewSymDense(d, nil)
	want := 2.0 // |μ1 − μ2|²
	for i := 0; i < d; i++ {
		s1.SetSym(i, i, a[i])
		s2.SetSym(i, i, b[i])
		want += (math.Sqrt(a[i]) - math.Sqrt(b[i])) * (math.Sqrt(a[i]) - math.Sqrt(b[i]))
	}
	got, err := Frechet(mu1, s1, mu2, s2)
	if err != nil || math.Abs(got-want) > 1e-9 {
		t.Errorf("diagonal: FD %v, want %v (%v)", got, want, err)
	}
	// Rotate both covariances by the same orthogonal Q: FD unchanged.
	r := rand.New(rand.NewPCG(1, 2))
	m := mat.NewDense(d, d, nil)
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			m.Set(i, j, r.NormFloat64())
		}
	}
	var qr mat.QR
	qr.Factorize(m)
	var q mat.Dense
	qr.QTo(&q)
	rot := func(s *mat.SymDense) *mat.SymDense {
		var t1, t2 mat.Dense
		t1.Mul(&q, s)
		t2.Mul(&t1, q.T())
		o := mat.NewSymDense(d, nil)
		for i := 0; i < d; i++ {
			for j := i; j < d; j++ {
				o.SetSym(i, j, (t2.At(i, j)+t2.At(j, i))/2)
			}
		}
		return o
	}
	if got, err := Frechet(mu1, rot(s1), mu2, rot(s2)); err != nil || math.Abs(got-want) > 1e-8 {
		t.Errorf("rotated: FD %v, want %v (%v)", got, want, err)
	}
	// Sample moments: the same samples give 0.
	f := make([]float32, 300*d)
	for i := range f {
		f[i] = float32(r.NormFloat64())
	}
	m1, c1 := Moments(f, 300, d)
	if got, _ := Frechet(m1, c1, m1, c1); math.Abs(got) > 1e-6 {
		t.Errorf("FD of a set with itself: %v", got)
	}
}

func TestMoments(t *testing.T) {
	f := []float32{1, 2, 3, 6}
	mu, s := Moments(f, 2, 2) // rows (1,2), (3,6)
	if mu[0] != 2 || mu[1] != 4 || s.At(0, 0) != 2 || s.At(1, 1) != 8 || s.At(0, 1) != 4 {
		t.Errorf("mean %v, covariance %v", mu, mat.Formatted(s))
	}
}

func TestGrid(t *testing.T) {
	const size = 4
	samples := make([]float32, 3*size*size)
	for i := range samples {
		samples[i] = float32(i%size)/2 - 1
	}
	g := Grid(samples, 3, size, 2)
	if g.Bounds().Dx() != 2*(size+2)+2 || g.Bounds().Dy() != 2*(size+2)+2 {
		t.Fatalf("grid %v", g.Bounds())
	}
	if g.Pix[0] != 128 || g.Pix[2*g.Stride+2] != Pixel(samples[0]) {
		t.Error("grid border or first pixel wrong")
	}
}

// TestAnimationStreams: the GIF written frame by frame decodes (image/gif)
// to the frames given, pixel for pixel (random grey levels, so the LZW
// codes grow past 9 bits and the data spans many sub-blocks), with the
// delay asked and looping forever; after each Add the bytes written so
// far plus a trailer decode to the frames added so far (a frame reaches
// the writer when Add returns); a frame of another size fails and writes
// nothing; Close after no frame writes nothing.
func TestAnimationStreams(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 7))
	const w, h, n = 37, 23, 4
	var buf bytes.Buffer
	a := NewAnimation(&buf, 8)
	var want []*image.Gray
	for f := 0; f < n; f++ {
		g := image.NewGray(image.Rect(0, 0, w, h))
		for i := range g.Pix {
			g.Pix[i] = uint8(r.IntN(256))
		}
		if f == 1 {
			for i := range g.Pix {
				g.Pix[i] = uint8(i / 7) // long runs: codes reused
			}
		}
		if err := a.Add(g); err != nil {
			t.Fatal(err)
		}
		want = append(want, g)
		d, err := gif.DecodeAll(bytes.NewReader(append(bytes.Clone(buf.Bytes()), 0x3B)))
		if err != nil || len(d.Image) != f+1 {
			t.Fatalf("after frame %d: %v (%d frames)", f, err, len(d.Image))
		}
	}
	if err := a.Add(image.NewGray(image.Rect(0, 0, w+1, h))); !errors.Is(err, ErrFrameSize) {
		t.Errorf("a frame of another size: %v, want ErrFrameSize", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	d, err := gif.DecodeAll(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Image) != n || d.LoopCount != 0 || d.Config.Width != w || d.Config.Height != h {
		t.Fatalf("%d frames, loop %d, %dx%d", len(d.Image), d.LoopCount, d.Config.Width, d.Config.Height)
	}
	for f, p := range d.Image {
		if d.Delay[f] != 13 { // 100/8 = 12.5 → 13 hundredths
			t.Errorf("frame %d: delay %d", f, d.Delay[f])
		}
		for i, v := range p.Pix {
			if y := p.Palette[v].(color.RGBA).R; y != want[f].Pix[i] {
				t.Fatalf("frame %d, pixel %d: %d, want %d", f, i, y, want[f].Pix[i])
			}
		}
	}
	var empty bytes.Buffer
	if err := NewAnimation(&empty, 10).Close(); err != nil || empty.Len() != 0 {
		t.Errorf("no frames: %v, %d bytes", err, empty.Len())
	}
}

func TestLabels(t *testing.T) {
	if y := Labels(12, -1, 10); y[11] != 1 || y[9] != 9 {
		t.Errorf("all: %v", y)
	}
	if y := Labels(3, 10, 10); y[2] != 10 {
		t.Errorf("null: %v", y)
	}
}
