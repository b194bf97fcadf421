package sample

import (
	"bufio"
	"fmt"
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
)

// Pixel maps a sample value in [−1, 1] (the training data's p/127.5 − 1)
// to an 8-bit grey level, rounding, values outside clamped.
func Pixel(v float32) uint8 {
	p := math.Round((float64(v) + 1) * 127.5)
	return uint8(max(0, min(255, p)))
}

// Gray is image i of samples (f32 [n, S, S, 1]) as an 8-bit image.
func Gray(samples []float32, i, size int) *image.Gray {
	g := image.NewGray(image.Rect(0, 0, size, size))
	px := samples[i*size*size : (i+1)*size*size]
	for j, v := range px {
		g.Pix[j] = Pixel(v)
	}
	return g
}

// Grid lays out n images of side size in rows of cols, with a 2-pixel
// border of grey level 128 around and between them.
func Grid(samples []float32, n, size, cols int) *image.Gray {
	cols = max(1, min(cols, n))
	rows := (n + cols - 1) / cols
	const gap = 2
	w, h := cols*(size+gap)+gap, rows*(size+gap)+gap
	g := image.NewGray(image.Rect(0, 0, w, h))
	for i := range g.Pix {
		g.Pix[i] = 128
	}
	for i := 0; i < n; i++ {
		x0, y0 := gap+(i%cols)*(size+gap), gap+(i/cols)*(size+gap)
		src := Gray(samples, i, size)
		for y := 0; y < size; y++ {
			copy(g.Pix[(y0+y)*w+x0:(y0+y)*w+x0+size], src.Pix[y*size:(y+1)*size])
		}
	}
	return g
}

// WritePNG writes img to path (image/png).
func WritePNG(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	if err := png.Encode(bw, img); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// FramePath is frame i's PNG in dir.
func FramePath(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("frame_%04d.png", i)) }
