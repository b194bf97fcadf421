package data

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// DefaultDir is where Debian's dataset-fashion-mnist package installs the files.
const DefaultDir = "/usr/share/datasets/fashion-mnist"

// Fashion-MNIST pixel statistics after scaling to [0,1]: the mean and the
// standard deviation over every pixel of the 60 000 training images
// (TestFashionStats recomputes them from the real files when present).
// Normalised pixels are (x/255 − Mean)/Std.
const (
	Mean = 0.2860
	Std  = 0.3530
)

// Split selects the training or the test part.
type Split int

const (
	// Train is the 60 000-example training split.
	Train Split = iota
	// Test is the 10 000-example test split ("t10k").
	Test
)

func (s Split) String() string {
	if s == Test {
		return "test"
	}
	return "train"
}

func (s Split) prefix() string {
	if s == Test {
		return "t10k"
	}
	return "train"
}

// Set is a labelled image set held in host memory as raw bytes.
type Set struct {
	Images     []uint8 // [N, Rows, Cols] row-major, 0 (background) to 255
	Labels     []uint8 // [N], class indices
	N          int     // number of examples
	Rows, Cols int     // image size (28×28 for Fashion-MNIST)
}

// Dim is the number of pixels of one image (Rows·Cols).
func (s *Set) Dim() int { return s.Rows * s.Cols }

// Classes is 1 + the largest label (10 for Fashion-MNIST).
func (s *Set) Classes() int {
	m := 0
	for _, l := range s.Labels {
		m = max(m, int(l)+1)
	}
	return m
}

// Limit returns the first n examples (all when n <= 0 or n >= N), sharing memory.
func (s *Set) Limit(n int) *Set {
	if n <= 0 || n >= s.N {
		return s
	}
	d := s.Dim()
	return &Set{Images: s.Images[:n*d], Labels: s.Labels[:n], N: n, Rows: s.Rows, Cols: s.Cols}
}

// findFile returns dir/name.gz or dir/name, whichever exists (gzip first).
func findFile(dir, name string) (string, error) {
	for _, p := range []string{filepath.Join(dir, name+".gz"), filepath.Join(dir, name)} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %s(.gz) in %s", ErrMissing, name, dir)
}

// Load reads one split of Fashion-MNIST (or MNIST: same file names) from dir:
// <prefix>-images-idx3-ubyte[.gz] and <prefix>-labels-idx1-ubyte[.gz] with
// prefix "train" or "t10k". It checks the magic numbers (2051 images, 2049
// labels), that images are 3-dimensional and labels 1-dimensional, and that
// both hold the same number of examples. Errors name the file at fault.
func Load(dir string, split Split) (*Set, error) {
	ip, err := findFile(dir, split.prefix()+"-images-idx3-ubyte")
	if err != nil {
		return nil, err
	}
	lp, err := findFile(dir, split.prefix()+"-labels-idx1-ubyte")
	if err != nil {
		return nil, err
	}
	ih, img, err := ReadIDX(ip)
	if err != nil {
		return nil, err
	}
	if ih.Magic != MagicImages || len(ih.Dims) != 3 {
		return nil, fmt.Errorf("%s: %w: magic %d with %d dimensions, want %d with 3 (images)", ip, ErrFormat, ih.Magic, len(ih.Dims), MagicImages)
	}
	lh, lab, err := ReadIDX(lp)
	if err != nil {
		return nil, err
	}
	if lh.Magic != MagicLabels || len(lh.Dims) != 1 {
		return nil, fmt.Errorf("%s: %w: magic %d with %d dimensions, want %d with 1 (labels)", lp, ErrFormat, lh.Magic, len(lh.Dims), MagicLabels)
	}
	if ih.Dims[0] != lh.Dims[0] {
		return nil, fmt.Errorf("%w: %s has %d images, %s has %d labels", ErrMismatch, ip, ih.Dims[0], lp, lh.Dims[0])
	}
	return &Set{Images: img, Labels: lab, N: ih.Dims[0], Rows: ih.Dims[1], Cols: ih.Dims[2]}, nil
}

// LoadFashionMNIST reads both splits from dir and checks that their image
// sizes agree.
func LoadFashionMNIST(dir string) (train, test *Set, err error) {
	if train, err = Load(dir, Train); err != nil {
		return nil, nil, err
	}
	if test, err = Load(dir, Test); err != nil {
		return nil, nil, err
	}
	if train.Rows != test.Rows || train.Cols != test.Cols {
		return nil, nil, fmt.Errorf("%w: train images are %d×%d, test images %d×%d", ErrMismatch, train.Rows, train.Cols, test.Rows, test.Cols)
	}
	return train, test, nil
}

// ErrBatch reports a bad batch request.
var ErrBatch = errors.New("data: bad batch")

// Normalize writes the normalised pixels of example i into dst (len Dim()):
// dst[j] = (x_j/255 − Mean)/Std, computed in float32.
func (s *Set) Normalize(dst []float32, i int) {
	img := s.Images[i*s.Dim() : (i+1)*s.Dim()]
	for j, p := range img {
		dst[j] = (float32(p)/255 - Mean) / Std
	}
}

// Fill writes a batch: for k in [0, len(idx)), row k of x ([len(idx), Dim()]
// f32, row-major) gets the normalised image idx[k] and y[k] its label.
// x must hold at least len(idx)·Dim() and y len(idx) elements.
func (s *Set) Fill(x []float32, y []int32, idx []int) error {
	d := s.Dim()
	if len(x) < len(idx)*d || len(y) < len(idx) {
		return fmt.Errorf("%w: %d examples into x of %d and y of %d elements", ErrBatch, len(idx), len(x), len(y))
	}
	for k, i := range idx {
		if i < 0 || i >= s.N {
			return fmt.Errorf("%w: example %d of %d", ErrBatch, i, s.N)
		}
		s.Normalize(x[k*d:(k+1)*d], i)
		y[k] = int32(s.Labels[i])
	}
	return nil
}
