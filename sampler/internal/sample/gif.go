package sample

import (
	"bufio"
	"compress/lzw"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"io"
	"math"
)

// Animation writes an animated GIF (GIF89a, W3C's "Graphics Interchange
// Format Version 89a", 1990) frame by frame as frames come, so that a
// viewer, `tail -c` or a pipe sees each frame once it is made and memory
// does not grow with the video's length. Every frame is an 8-bit grey
// image of the first frame's size, drawn with a global palette of the 256
// grey levels (so pixels are stored as they are, no quantisation), and the
// animation loops forever (the NETSCAPE2.0 extension). Image data is
// LZW-compressed by compress/lzw (LSB order, 8-bit literals: GIF's
// variant) and cut into sub-blocks of at most 255 bytes.
type Animation struct {
	w      *bufio.Writer
	delay  uint16 // hundredths of a second per frame
	dx, dy int
	frames int
	err    error // the first write error: every later call returns it
	closed bool
}

// NewAnimation starts an animation on w played at fps frames per second
// (GIF delays are whole hundredths of a second, at least 1). Nothing is
// written until the first frame (whose size is the animation's).
func NewAnimation(w io.Writer, fps float64) *Animation {
	return &Animation{w: bufio.NewWriter(w), delay: uint16(max(1, min(math.MaxUint16, math.Round(100/fps))))}
}

// ErrFrameSize reports a frame whose size is not the first frame's.
var ErrFrameSize = errors.New("sample: GIF frames must all have the first frame's size")

// Add writes a grey frame and flushes it to the writer. A frame of
// another size than the first fails with ErrFrameSize (and writes
// nothing); GIF's sizes are 16-bit, so sides above 65535 fail too.
func (a *Animation) Add(img *image.Gray) error {
	if a.err != nil {
		return a.err
	}
	if a.closed {
		return errors.New("sample: Add after Close")
	}
	b := img.Bounds()
	if a.frames == 0 {
		if b.Dx() < 1 || b.Dy() < 1 || b.Dx() > math.MaxUint16 || b.Dy() > math.MaxUint16 {
			return fmt.Errorf("%w: %v", ErrFrameSize, b)
		}
		a.dx, a.dy = b.Dx(), b.Dy()
		a.header()
	} else if b.Dx() != a.dx || b.Dy() != a.dy {
		return fmt.Errorf("%w: %dx%d after %dx%d", ErrFrameSize, b.Dx(), b.Dy(), a.dx, a.dy)
	}
	// Graphic control extension (the frame's delay), image descriptor
	// (the whole screen, no local palette), LZW minimum code size 8.
	a.put(0x21, 0xF9, 4, 0)
	a.u16(a.delay)
	a.put(0, 0)
	a.put(0x2C)
	a.u16(0)
	a.u16(0)
	a.u16(uint16(a.dx))
	a.u16(uint16(a.dy))
	a.put(0, 8)
	sb := &subBlocks{w: a.w}
	lw := lzw.NewWriter(sb, lzw.LSB, 8)
	for y := b.Min.Y; y < b.Max.Y && a.err == nil; y++ {
		off := img.PixOffset(b.Min.X, y)
		if _, err := lw.Write(img.Pix[off : off+a.dx]); err != nil {
			a.err = err
		}
	}
	if err := lw.Close(); err != nil && a.err == nil {
		a.err = err
	}
	if err := sb.flush(); err != nil && a.err == nil {
		a.err = err
	}
	a.put(0) // block terminator
	if a.err == nil {
		a.err = a.w.Flush()
	}
	if a.err == nil {
		a.frames++
	}
	return a.err
}

// Close writes the trailer (after at least one frame; an animation with
// none writes nothing) and flushes. It does not close the writer.
func (a *Animation) Close() error {
	if a.closed || a.err != nil {
		return a.err
	}
	a.closed = true
	if a.frames == 0 {
		return nil
	}
	a.put(0x3B)
	a.err = a.w.Flush()
	return a.err
}

// header writes the GIF89a signature, the logical screen descriptor
// (global palette of 256 entries), the grey palette and the looping
// extension.
func (a *Animation) header() {
	a.w.WriteString("GIF89a")
	a.u16(uint16(a.dx))
	a.u16(uint16(a.dy))
	a.put(0xF7, 0, 0) // global table, 8 bits of colour resolution, 2^(7+1) entries; background 0; no aspect
	for i := 0; i < 256; i++ {
		a.put(byte(i), byte(i), byte(i))
	}
	a.put(0x21, 0xFF, 11)
	a.w.WriteString("NETSCAPE2.0")
	a.put(3, 1, 0, 0, 0) // loop count 0: forever
}

func (a *Animation) put(b ...byte) { a.w.Write(b) }

func (a *Animation) u16(v uint16) { a.w.Write(binary.LittleEndian.AppendUint16(nil, v)) }

// subBlocks cuts a stream into GIF data sub-blocks: a length byte (1–255)
// and that many bytes.
type subBlocks struct {
	w   io.Writer
	buf [256]byte
	n   int
}

func (s *subBlocks) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		c := copy(s.buf[1+s.n:], p)
		s.n += c
		p = p[c:]
		if s.n == 255 {
			if err := s.flush(); err != nil {
				return total - len(p), err
			}
		}
	}
	return total, nil
}

func (s *subBlocks) flush() error {
	if s.n == 0 {
		return nil
	}
	s.buf[0] = byte(s.n)
	_, err := s.w.Write(s.buf[:1+s.n])
	s.n = 0
	return err
}
