package data

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func idxBytes(magic uint32, dims []int, body []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, magic)
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, uint32(d))
	}
	b.Write(body)
	return b.Bytes()
}

func gz(b []byte) []byte {
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	w.Write(b)
	w.Close()
	return out.Bytes()
}

// writeSet writes a random set of n r×c images into dir under prefix; gzip'd when zip.
func writeSet(t *testing.T, dir, prefix string, n, r, c int, zip bool, rng *rand.Rand) ([]byte, []byte) {
	t.Helper()
	img := make([]byte, n*r*c)
	for i := range img {
		img[i] = byte(rng.IntN(256))
	}
	lab := make([]byte, n)
	for i := range lab {
		lab[i] = byte(rng.IntN(10))
	}
	ib := idxBytes(MagicImages, []int{n, r, c}, img)
	lb := idxBytes(MagicLabels, []int{n}, lab)
	ext := ""
	if zip {
		ib, lb, ext = gz(ib), gz(lb), ".gz"
	}
	must(t, os.WriteFile(filepath.Join(dir, prefix+"-images-idx3-ubyte"+ext), ib, 0o644))
	must(t, os.WriteFile(filepath.Join(dir, prefix+"-labels-idx1-ubyte"+ext), lb, 0o644))
	return img, lab
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestLoadRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
	for _, zip := range []bool{true, false} {
		dir := t.TempDir()
		n, r, c := 5+rng.IntN(20), 1+rng.IntN(9), 1+rng.IntN(9)
		img, lab := writeSet(t, dir, "train", n, r, c, zip, rng)
		tImg, tLab := writeSet(t, dir, "t10k", 3, r, c, zip, rng)
		train, test, err := LoadFashionMNIST(dir)
		must(t, err)
		if train.N != n || train.Rows != r || train.Cols != c || !bytes.Equal(train.Images, img) || !bytes.Equal(train.Labels, lab) {
			t.Fatalf("zip=%v: train set differs from what was written", zip)
		}
		if test.N != 3 || !bytes.Equal(test.Images, tImg) || !bytes.Equal(test.Labels, tLab) {
			t.Fatalf("zip=%v: test set differs", zip)
		}
		// Fill against a float64 reference.
		idx := []int{n - 1, 0, n / 2}
		x := make([]float32, len(idx)*train.Dim())
		y := make([]int32, len(idx))
		must(t, train.Fill(x, y, idx))
		for k, i := range idx {
			if y[k] != int32(lab[i]) {
				t.Fatalf("label %d: %d want %d", k, y[k], lab[i])
			}
			for j := range train.Dim() {
				want := (float64(img[i*train.Dim()+j])/255 - Mean) / Std
				if d := math.Abs(float64(x[k*train.Dim()+j]) - want); d > 1e-6*math.Max(1, math.Abs(want)) {
					t.Fatalf("pixel %d,%d: %v want %v", k, j, x[k*train.Dim()+j], want)
				}
			}
		}
		if err := train.Fill(x, y, []int{n}); !errors.Is(err, ErrBatch) {
			t.Fatalf("out-of-range index: %v", err)
		}
		if l := train.Limit(2); l.N != 2 || len(l.Labels) != 2 || len(l.Images) != 2*r*c {
			t.Fatalf("limit: %+v", l)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
	cases := []struct {
		name  string
		edit  func(dir string)
		want  error
		names string // file named in the message
	}{
		{"missing", func(dir string) { os.Remove(filepath.Join(dir, "train-labels-idx1-ubyte")) }, ErrMissing, "train-labels"},
		{"truncated images", func(dir string) {
			p := filepath.Join(dir, "train-images-idx3-ubyte")
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)-7], 0o644)
		}, ErrTruncated, "train-images-idx3-ubyte"},
		{"truncated header", func(dir string) {
			p := filepath.Join(dir, "train-labels-idx1-ubyte")
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:6], 0o644)
		}, ErrTruncated, "train-labels-idx1-ubyte"},
		{"truncated gzip", func(dir string) {
			p := filepath.Join(dir, "train-images-idx3-ubyte")
			b, _ := os.ReadFile(p)
			z := gz(b)
			os.Remove(p)
			os.WriteFile(p+".gz", z[:len(z)/2], 0o644)
		}, ErrTruncated, "train-images-idx3-ubyte.gz"},
		{"swapped magic", func(dir string) {
			p := filepath.Join(dir, "train-labels-idx1-ubyte")
			os.WriteFile(p, idxBytes(MagicImages, []int{4, 1, 1}, make([]byte, 4)), 0o644)
		}, ErrFormat, "train-labels-idx1-ubyte"},
		{"count mismatch", func(dir string) {
			p := filepath.Join(dir, "train-labels-idx1-ubyte")
			os.WriteFile(p, idxBytes(MagicLabels, []int{3}, make([]byte, 3)), 0o644)
		}, ErrMismatch, "train-labels-idx1-ubyte"},
		{"bad type", func(dir string) {
			p := filepath.Join(dir, "train-labels-idx1-ubyte")
			os.WriteFile(p, idxBytes(0x00000901, []int{4}, make([]byte, 16)), 0o644)
		}, ErrFormat, "train-labels-idx1-ubyte"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeSet(t, dir, "train", 4, 2, 3, false, rng)
			tc.edit(dir)
			_, err := Load(dir, Train)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("got %v, want %v naming %s", err, tc.want, tc.names)
			}
		})
	}
}

func TestDecodeIDXHeader(t *testing.T) {
	h, err := DecodeIDXHeader(idxBytes(MagicImages, []int{7, 28, 28}, nil))
	if err != nil || h.Magic != 2051 || !slices.Equal(h.Dims, []int{7, 28, 28}) || h.Len() != 7*28*28 || h.Size() != 16 {
		t.Fatalf("%+v %v", h, err)
	}
	for _, b := range [][]byte{
		{0, 0, 8}, {0, 0, 8, 1, 0, 0}, // short
		{1, 0, 8, 1, 0, 0, 0, 1}, // nonzero first byte
		{0, 0, 8, 0},             // zero dims
		{0, 0, 8, 5, 0, 0, 0, 1}, // too many dims
		{0, 0, 8, 1, 0, 0, 0, 0}, // empty dim
		idxBytes(MagicImages, []int{1 << 16, 1 << 16, 1}, nil), // too many elements
	} {
		if _, err := DecodeIDXHeader(b); !errors.Is(err, ErrFormat) && !errors.Is(err, ErrTruncated) {
			t.Fatalf("%x: %v", b, err)
		}
	}
}

func FuzzDecodeIDXHeader(f *testing.F) {
	f.Add(idxBytes(MagicImages, []int{2, 3, 4}, nil))
	f.Add(idxBytes(MagicLabels, []int{9}, nil))
	f.Add([]byte{0, 0, 8, 4, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeIDXHeader(b)
		if err != nil {
			return
		}
		if h.Size() > len(b) || h.Len() < 1 || h.Len() > maxIDXElems {
			t.Fatalf("accepted %x as %+v", b, h)
		}
		// Decoding a whole file with this header never panics and never
		// returns more bytes than the header announces.
		_, body, err := decodeIDX(bufio.NewReader(bytes.NewReader(b)))
		if err == nil && len(body) != h.Len() {
			t.Fatalf("body %d bytes, header says %d", len(body), h.Len())
		}
	})
}

func TestOrder(t *testing.T) {
	seed := rand.Uint64()
	n := 1000 + rand.IntN(1000)
	a, b := Order(n, seed, 3), Order(n, seed, 3)
	if !slices.Equal(a, b) {
		t.Fatal("same seed and epoch gave different orders")
	}
	if slices.Equal(a, Order(n, seed, 4)) || slices.Equal(a, Order(n, seed+1, 3)) {
		t.Fatal("different epoch or seed gave the same order")
	}
	s := slices.Clone(a)
	slices.Sort(s)
	for i := range s {
		if s[i] != i {
			t.Fatalf("not a permutation at %d", i)
		}
	}
	if Batches(10, 3, true) != 3 || Batches(10, 3, false) != 4 || Batches(9, 3, true) != 3 || Batches(2, 3, true) != 0 {
		t.Fatal("batch counts")
	}
	if !slices.Equal(Batch(a[:10], 3, 3), a[9:10]) || Batch(a[:10], 3, 4) != nil {
		t.Fatal("batch slices")
	}
}

// TestFashionStats loads the real files (when installed) and recomputes the
// documented pixel statistics from the training images.
func TestFashionStats(t *testing.T) {
	if _, err := os.Stat(DefaultDir); err != nil {
		t.Skipf("no Fashion-MNIST in %s", DefaultDir)
	}
	train, test, err := LoadFashionMNIST(DefaultDir)
	must(t, err)
	if train.N != 60000 || test.N != 10000 || train.Rows != 28 || train.Cols != 28 || train.Classes() != 10 {
		t.Fatalf("train %d test %d %dx%d classes %d", train.N, test.N, train.Rows, train.Cols, train.Classes())
	}
	var s, s2 float64
	for _, p := range train.Images {
		v := float64(p) / 255
		s += v
		s2 += v * v
	}
	n := float64(len(train.Images))
	mean := s / n
	std := math.Sqrt(s2/n - mean*mean)
	if math.Abs(mean-Mean) > 5e-5 || math.Abs(std-Std) > 5e-5 {
		t.Fatalf("mean %.5f std %.5f, documented %.4f %.4f", mean, std, Mean, Std)
	}
}
